"""Moved to minitx.generation.inputs: the old path, the very same module."""

import sys

from .generation import inputs

sys.modules[__name__] = inputs
