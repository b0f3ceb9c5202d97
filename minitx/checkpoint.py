"""Moved to minitx.files.checkpoint: the old path, the very same module."""

import sys

from .files import checkpoint

sys.modules[__name__] = checkpoint
