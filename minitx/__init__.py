"""minitx: a small, fast, trainable decoder-only transformer with switchable attention."""

from . import functional
from .cache import kv_cache_bytes
from .config import AttentionConfig, ModelConfig
from .model import Transformer

__all__ = ["AttentionConfig", "ModelConfig", "Transformer", "functional", "kv_cache_bytes"]
__version__ = "0.1.0"
