"""minitx: a small, fast, trainable decoder-only transformer with switchable attention."""

from . import functional
from .attention import Attention, KindLayer
from .cache import kv_cache_bytes
from .config import AttentionConfig, ModelConfig
from .kinds import KindSpec, import_kind_modules, register
from .model import Transformer
from .options import OptionError

__all__ = [
    "Attention",
    "AttentionConfig",
    "KindLayer",
    "KindSpec",
    "ModelConfig",
    "OptionError",
    "Transformer",
    "functional",
    "import_kind_modules",
    "kv_cache_bytes",
    "register",
]
__version__ = "0.1.0"
