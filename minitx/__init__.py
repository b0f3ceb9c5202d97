"""minitx: a small, fast, trainable decoder-only transformer with switchable attention."""

from . import functional
from .attention import Attention
from .cache import kv_cache_bytes
from .config import AttentionConfig, ModelConfig
from .kinds import KindSpec, OptionError, register
from .model import Transformer

__all__ = [
    "Attention",
    "AttentionConfig",
    "KindSpec",
    "ModelConfig",
    "OptionError",
    "Transformer",
    "functional",
    "kv_cache_bytes",
    "register",
]
__version__ = "0.1.0"
