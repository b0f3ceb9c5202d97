"""Moved to minitx.files.runlock: the old path, the very same module."""

import sys

from .files import runlock

sys.modules[__name__] = runlock
