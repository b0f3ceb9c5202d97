"""The Hugging Face ecosystem: export to transformers, import Llama/Mistral/Qwen2 weights, lm-eval.

transformers, safetensors and lm-eval are optional (`pip install -e ".[hf]"`, `".[eval]"`):
each is imported only where it is used, through `require`, which names the extra when missing.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from ..errors import UserError

EXTRAS = {"transformers": "hf", "safetensors": "hf", "lm_eval": "eval"}


def require_installed(*modules: str) -> None:
    """require's one-line UserError for the first module not installed, without importing any:
    a command checks its other inputs (a checkpoint's path) before it pays for transformers' import."""
    for module in modules:
        if importlib.util.find_spec(module.split(".")[0]) is None:
            require(module)


def require(module: str) -> ModuleType:
    """Import an optional dependency, or a one-line UserError saying which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.split(".")[0]
        extra = EXTRAS.get(top, "hf")
        raise UserError(f'{top} is not installed; install it with: pip install -e ".[{extra}]"') from None
