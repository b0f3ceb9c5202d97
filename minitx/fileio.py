"""Moved to minitx.files.atomic: the old path, the very same module."""

import sys

from .files import atomic

sys.modules[__name__] = atomic
