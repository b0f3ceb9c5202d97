"""The Hugging Face ecosystem: export to transformers, import Llama/Mistral/Qwen2 weights, lm-eval.

transformers, safetensors and lm-eval are optional (`pip install -e ".[hf]"`, `".[eval]"`):
each is imported only where it is used, through `require`, which names the extra when missing.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import UserError

EXTRAS = {"transformers": "hf", "safetensors": "hf", "lm_eval": "eval"}


def require(module: str) -> ModuleType:
    """Import an optional dependency, or a one-line UserError saying which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.split(".")[0]
        extra = EXTRAS.get(top, "hf")
        raise UserError(f'{top} is not installed; install it with: pip install -e ".[{extra}]"') from None
