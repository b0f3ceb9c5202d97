"""Moved to minitx.attention.mta.torch_math: the old path, the very same module."""

import sys

from . import torch_math

sys.modules[__name__] = torch_math
