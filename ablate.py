"""python ablate.py --help: see README.md."""

import sys

from minitx.cli import ablate_main

if __name__ == "__main__":
    sys.exit(ablate_main())
