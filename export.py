"""python export.py --help: see README.md."""

import sys

from minitx.cli import export_main

if __name__ == "__main__":
    sys.exit(export_main())
