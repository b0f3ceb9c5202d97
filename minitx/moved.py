"""Module paths that are gone, refused in one line that names where their code lives now.

What minitx records (a run's command line and config, a checkpoint's class paths, submitit's
pickled jobs) names modules at their present homes, and tests/project/test_recorded_paths.py
holds those paths: no file that minitx wrote needs an old path. So an old path is not kept as an
alias of the new module; code written against an older minitx that imports one is told where to
import from instead (installed by minitx/__init__.py, consulted only when no file answers a name).
"""

from __future__ import annotations

import importlib.abc
import sys

# Old module path -> where its names live now, as the refusal says it.
RETIRED = {
    "minitx.checkpoint": "minitx.files.checkpoint (load_checkpoint: minitx.trained_model)",
    "minitx.fileio": "minitx.files.atomic",
    "minitx.runlock": "minitx.files.runlock",
    "minitx.legacy": "minitx.files.legacy",
    "minitx.configfiles": "minitx.files.configs",
    "minitx.generate_inputs": "minitx.generation.inputs",
    "minitx.generation.loop": "minitx.decoding.loop",
    "minitx.generation.sampling": "minitx.decoding.sampling",
    "minitx.attention.mta.kernels": "minitx.attention.mta.torch_math",
    "minitx.ablation.runs.designed": "minitx.ablation.designed_sweep",
}


class RetiredPaths(importlib.abc.MetaPathFinder):
    """Answers only the names of RETIRED, with the one-line refusal; every other import goes on
    as if it were not there."""

    def find_spec(self, name, path=None, target=None):
        if name in RETIRED:
            raise ModuleNotFoundError(f"{name} moved: import from {RETIRED[name]}", name=name)
        return None


def install() -> None:
    """Appended to sys.meta_path: asked last, after every file has had its say."""
    if not any(isinstance(finder, RetiredPaths) for finder in sys.meta_path):
        sys.meta_path.append(RetiredPaths())
