"""Moved to minitx.files.configs: the old path, the very same module."""

import sys

from .files import configs

sys.modules[__name__] = configs
