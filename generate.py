"""python generate.py --help: see README.md."""

import sys

from minitx.cli import generate_main

if __name__ == "__main__":
    sys.exit(generate_main())
