"""python train.py --help: see README.md."""

import sys

from minitx.cli import train_main

if __name__ == "__main__":
    sys.exit(train_main())
