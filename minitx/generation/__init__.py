"""Generation: text from a trained model.

sampling.py   one new token per row from the last logits: greedy, temperature, top-k, top-p
loop.py       the decode loop behind `Transformer.generate`: prefill, steps through the cache
inputs.py     generate's option checks made before the checkpoint is read
command.py    the `generate` command: the prompt, text streamed as it is made

Until it became this package, `minitx.generation` was the command's module, which also
re-exported the loop and the filters: those names are still here, each loaded from its module
when first asked for, so that `import minitx` (the model imports the loop) loads no command,
checkpoint reader or argparse, and the loop's module can import this package without a circle.
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
    "CachedSteps": "loop",
    "CroppedSteps": "loop",
    "check_prompt_fits": "loop",
    "generate": "loop",
    "check_options": "sampling",
    "pick_next": "sampling",
    "top_k_filter": "sampling",
    "top_p_filter": "sampling",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value  # asked once: a plain attribute from then on
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
