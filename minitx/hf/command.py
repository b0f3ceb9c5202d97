"""The export command: `python export.py --ckpt CKPT --out DIR` (also `minitx-export`)."""

from __future__ import annotations

from collections.abc import Sequence

from ..arguments import ArgumentParser
from .export import DTYPES, export_checkpoint


def parse_args(argv: Sequence[str] | None):
    parser = ArgumentParser(
        prog="export.py",
        description="Write a minitx checkpoint as a transformers model directory: a native Llama/Mistral/Ministral "
        "model where the architecture is one, else custom code (load with trust_remote_code=True).",
    )
    parser.add_argument("--ckpt", required=True, help="a checkpoint written by train.py")
    parser.add_argument("--out", required=True, help="the model directory to write")
    parser.add_argument(
        "--dtype", default="float32", help=f"weights' dtype: {', '.join(DTYPES)} (default float32)"
    )
    parser.add_argument("--force", action="store_true", help="replace a non-empty --out")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> str:
    args = parse_args(argv)
    return export_checkpoint(args.ckpt, args.out, dtype=args.dtype, force=args.force)
