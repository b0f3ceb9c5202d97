"""Modules that moved, still importable at their old paths, with no file left behind there.

Code written against an older minitx imports `minitx.checkpoint`, a pickle or a saved config names
`minitx.ablation.runs.designed.run_designed`: an import hook (installed by minitx/__init__.py,
consulted only when no file answers a name) gives the old path the very module that lives at the
new one. So a module has one home, the one that is read and changed; the old path is a line here.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types

# Old module path -> its home now. The old path gives the very same module object.
MOVED = {
    "minitx.checkpoint": "minitx.files.checkpoint",
    "minitx.fileio": "minitx.files.atomic",
    "minitx.runlock": "minitx.files.runlock",
    "minitx.legacy": "minitx.files.legacy",
    "minitx.configfiles": "minitx.files.configs",
    "minitx.generate_inputs": "minitx.generation.inputs",
    "minitx.attention.mta.kernels": "minitx.attention.mta.torch_math",
    "minitx.ablation.runs.designed": "minitx.ablation.designed_sweep",
}

# Old module path -> {its new homes: the public names each took}: the old path is a module of its
# own holding the very same objects.
SPLIT = {
    "minitx.decoding": {
        "minitx.generation.loop": (
            "COMPILED_DECODING",
            "CachedSteps",
            "CroppedSteps",
            "check_prompt_fits",
            "compiled_decoding",
            "generate",
        ),
        "minitx.generation.sampling": ("check_options", "pick_next", "top_k_filter", "top_p_filter"),
    },
}


class OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds only the names of MOVED and SPLIT; every other import goes on as if it were not there."""

    def __init__(self) -> None:
        self.homes: dict[str, importlib.machinery.ModuleSpec] = {}

    def find_spec(self, name, path=None, target=None):
        if name in MOVED or name in SPLIT:
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        if spec.name in MOVED:
            module = importlib.import_module(MOVED[spec.name])
            self.homes[spec.name] = module.__spec__  # the import system overwrites it next
            return module
        homes = SPLIT[spec.name]
        module = types.ModuleType(spec.name, f"Moved: its names now live in {', '.join(homes)}.")
        module.__all__ = [name for names in homes.values() for name in names]
        for home, names in homes.items():
            source = importlib.import_module(home)
            module.__dict__.update({name: getattr(source, name) for name in names})
        return module

    def exec_module(self, module):
        home = self.homes.pop(module.__spec__.name, None)
        if home is not None:
            module.__spec__ = home  # the module stays what it is at home (reload, pickling)


def install() -> None:
    """Appended to sys.meta_path: asked last, after every file has had its say."""
    if not any(isinstance(finder, OldPaths) for finder in sys.meta_path):
        sys.meta_path.append(OldPaths())
