"""python prepare.py --help: see README.md."""

import sys

from minitx.cli import prepare_main

if __name__ == "__main__":
    sys.exit(prepare_main())
