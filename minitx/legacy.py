"""Moved to minitx.files.legacy: the old path, the very same module."""

import sys

from .files import legacy

sys.modules[__name__] = legacy
