"""python evaluate.py --help: see README.md."""

import sys

from minitx.cli import eval_main

if __name__ == "__main__":
    sys.exit(eval_main())
