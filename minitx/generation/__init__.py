"""Generation: the generate command, text from a trained model.

inputs.py     generate's option checks made before the checkpoint is read
command.py    the `generate` command: the prompt, text streamed as it is made

The decode loop behind `Transformer.generate` and the sampling filters are minitx/decoding/, below
the model; this package sits above it, as it loads a trained model (minitx/trained_model.py).
Until it became this package, `minitx.generation` was the command's module, which also
re-exported the loop and the filters: those names are still here, each loaded from its module
when first asked for, so that importing this package loads no command, checkpoint reader or
argparse.
"""

from __future__ import annotations

import importlib

# The names `minitx.generation` had before it became a package, by the module that holds each now.
_HOMES = {
    "TextStream": "command",
    "main": "command",
    "parse_args": "command",
    "load_checkpoint": "command",
    "check_generate_args": "inputs",
    "CachedSteps": "minitx.decoding.loop",
    "CroppedSteps": "minitx.decoding.loop",
    "check_prompt_fits": "minitx.decoding.loop",
    "generate": "minitx.decoding.loop",
    "check_options": "minitx.decoding.sampling",
    "pick_next": "minitx.decoding.sampling",
    "top_k_filter": "minitx.decoding.sampling",
    "top_p_filter": "minitx.decoding.sampling",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = _HOMES[name]
    value = getattr(importlib.import_module(home if "." in home else f"{__name__}.{home}"), name)
    globals()[name] = value  # asked once: a plain attribute from then on
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
