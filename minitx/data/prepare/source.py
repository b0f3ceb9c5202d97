"""Stage 1, the source: the segments a data setting reads (Shakespeare, files, a Hub dataset), each
a stream of pieces going to a split, and the decoding of pieces to text."""

from __future__ import annotations

import codecs
import functools
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minitx.data.sources import VAL_PLAYS, expand_globs, play_markdown_to_text, shakespeare_plays
from minitx.data.streams import (
    JoinedText,
    Piece,
    RecordSource,
    bytes_part,
    data_file_names,
    file_part,
    path_fingerprint,
    record_builder,
)
from minitx.errors import UserError, require

from .settings import DataSettings

# -------------------------------------------------------------------------------- the source


@dataclass
class Segment:
    """One stream of the source: a joined text or records, going to a split (or both, by record)."""

    split: str  # "train", "val", or "mixed": records, every k-th to validation (val_fraction)
    text: JoinedText | None = None
    start: int = 0  # byte range of the text
    end: int = 0
    records: RecordSource | None = None

    def pieces(self, index: int, position: int, val_fraction: float, piece_bytes: int) -> Iterator[Piece]:
        if self.text is not None:
            for end, data in self.text.pieces(max(self.start, position), self.end, piece_bytes):
                yield Piece(self.split, data, [index, end], origin=self.text)
            return
        assert self.records is not None
        for count, document in enumerate(self.records.documents(position), start=position + 1):
            if document:
                yield Piece(self._split_of(count - 1, val_fraction), document, [index, count], True)

    def _split_of(self, record: int, val_fraction: float) -> str:
        if self.split != "mixed":
            return self.split
        # Record r is validation when the running count of floor(r * f) steps up at r: every
        # 1/f-th record, spread evenly from the start, however long the stream turns out to be.
        return "val" if int((record + 1) * val_fraction) > int(record * val_fraction) else "train"


@dataclass
class Source:
    identity: dict  # what decides the ids: hashed into the directory's name
    make_segments: Callable[[], list[Segment]]  # called when a prepare first needs the segments
    fingerprint: Callable[[], Any]  # cheap: stats, names and revisions, nothing read
    describe: str  # for messages, e.g. "data.train_files"
    val_hint: str = "raise data.val_fraction"
    # The file of each fingerprint entry named otherwise than by its path (the plays, by file name),
    # hashed when only its modification time changed (content.py).
    paths: dict[str, Path] = field(default_factory=dict)

    @functools.cached_property
    def segments(self) -> list[Segment]:
        """Made on first use: opening prepared data reads no text."""
        return self.make_segments()


def _text_segment(split: str, parts: list, field_name: str) -> Segment:
    text = JoinedText(parts, field_name)
    require(any(part.size for part in parts), f"{field_name}: the text is empty; add text")
    return Segment(split, text=text, start=0, end=text.size)


def _split_tail(text: JoinedText, val_fraction: float) -> list[Segment]:
    # The tail from the exact fraction's point, moved to the nearest place where the text can be
    # cut (a line end): later if there is one, else earlier.
    point = int(text.size * (1.0 - val_fraction))
    val_empty = "data.val_fraction: the validation set is empty; raise data.val_fraction or add more text"
    if text.size - point < (1 << 20) and not text.read(point, 1 << 20).strip():
        raise UserError(val_empty)
    cut = text.cut_at_or_after(point)
    if cut >= text.size:
        cut = text.cut_at_or_before(point)
    if cut == 0:  # a text without line ends: between words (as a single long line is cut)
        cut = text.word_cut_at_or_after(point)
    if cut == 0:
        raise UserError(
            "data.val_fraction: the training set is empty; lower data.val_fraction or add more text"
        )
    if cut >= text.size:
        raise UserError(val_empty)
    return [
        Segment("train", text=text, start=0, end=cut),
        Segment("val", text=text, start=cut, end=text.size),
    ]


def shakespeare_source(val_plays: tuple[str, ...] = VAL_PLAYS) -> Source:
    plays = shakespeare_plays(val_plays)

    def parts(stems: list[str]) -> list:
        return [
            bytes_part(stem, play_markdown_to_text(plays[stem].read_text(encoding="utf-8")).encode("utf-8"))
            for stem in stems
        ]

    def segments() -> list[Segment]:  # the plays are converted to text only when a prepare needs them
        train = [stem for stem in plays if stem not in val_plays]
        val = [stem for stem in plays if stem in val_plays]
        return [
            _text_segment("train", parts(train), "shakespeare"),
            _text_segment("val", parts(val), "shakespeare"),
        ]

    paths = list(plays.values())
    return Source(
        {"source": "shakespeare", "val_plays": list(val_plays)},
        segments,
        lambda: [[Path(p).name, size, mtime] for p, size, mtime in path_fingerprint(paths)],
        "the built-in Shakespeare",
        paths={Path(p).name: Path(p) for p in paths},
    )


def files_source(settings: DataSettings) -> Source:
    train_paths = expand_globs(settings.train_files, "data.train_files")
    val_paths = expand_globs(settings.val_files, "data.val_files") if settings.val_files else []
    builder = record_builder(train_paths, "data.train_files")
    if val_paths and record_builder(val_paths, "data.val_files") != builder:
        raise UserError("data.val_files: is not the same kind of file as data.train_files; give one kind")
    identity = {
        "source": "files",
        "train": [str(p.resolve()) for p in train_paths],
        "val": [str(p.resolve()) for p in val_paths],
        "val_fraction": None if val_paths else settings.val_fraction,
    }
    segments = None  # a single text: its tail split off when a prepare first needs it (it reads)
    if builder is not None:
        identity["text_column"] = settings.text_column

        def records(split: str, paths: list[Path], field_name: str) -> Segment:
            files = [str(p) for p in paths]
            source = RecordSource(builder, None, files, "train", None, settings.text_column, field_name)
            return Segment(split, records=source)

        train = records("train" if val_paths else "mixed", train_paths, "data.train_files")
        segments = [train, records("val", val_paths, "data.val_files")] if val_paths else [train]
    else:
        for path in train_paths + val_paths:
            field_name = "data.val_files" if path in val_paths else "data.train_files"
            if _blank(path, field_name):
                raise UserError(f"{field_name}: {str(path)!r} is empty; remove it or add text")
        train_text = JoinedText([file_part(p) for p in train_paths], "data.train_files")
        if val_paths:
            segments = [
                Segment("train", text=train_text, start=0, end=train_text.size),
                _text_segment("val", [file_part(p) for p in val_paths], "data.val_files"),
            ]
    if not val_paths:
        _check_fraction(settings.val_fraction)
    all_paths = train_paths + val_paths
    return Source(
        identity,
        lambda: segments or _split_tail(train_text, settings.val_fraction),
        lambda: path_fingerprint(all_paths),
        "data.train_files" + (" / data.val_files" if val_paths else ""),
        "add validation text" if val_paths else "raise data.val_fraction",
    )


def hf_source(settings: DataSettings) -> Source:
    if not settings.hf_name:
        raise UserError("data.hf_name: required when data.source=hf, e.g. 'roneneldan/TinyStories'")
    data_files = settings.hf_data_files
    local = _local_paths(data_files)

    def records(split: str, hf_split: str, field_name: str) -> Segment:
        name, revision, column = settings.hf_name, settings.hf_revision, settings.text_column
        source = RecordSource(name, settings.hf_config, data_files, hf_split, revision, column, field_name)
        return Segment(split, records=source)

    val_split = settings.hf_val_split
    train = records("train" if val_split else "mixed", settings.hf_train_split, "data.hf_train_split")
    segments = [train, records("val", val_split, "data.hf_val_split")] if val_split else [train]
    if not val_split:
        _check_fraction(settings.val_fraction)
    identity = {
        "source": "hf",
        "name": settings.hf_name,
        "config": settings.hf_config,
        "splits": [settings.hf_train_split, val_split],
        "val_fraction": None if val_split else settings.val_fraction,
        "data_files": data_files if not local else [str(Path(p).resolve()) for p in local],
        "revision": settings.hf_revision,
        "text_column": settings.text_column,
    }
    # A Hub dataset is named by its name, config, splits and revision: starting on prepared data
    # needs no network. Pin data.hf_revision to a commit to be sure the data never moves.
    return Source(
        identity,
        lambda: segments,
        (lambda: path_fingerprint(local)) if local else (lambda: dict(identity)),
        "data.hf_name",
        "add a validation split" if val_split else "raise data.val_fraction",
    )


def _blank(path: Path, field_name: str) -> bool:
    """Whether a text file holds nothing but whitespace (only small files are read to tell)."""
    try:
        size = path.stat().st_size
        return size == 0 or (size <= 4096 and not path.read_bytes().strip())
    except OSError as err:
        raise UserError(f"{field_name}: cannot read {str(path)!r} ({err.strerror}); check the file") from None


def _local_paths(data_files: Any) -> list[Path]:
    paths = [Path(os.path.expanduser(name)) for name in data_file_names(data_files)]
    return paths if paths and all(p.is_file() for p in paths) else []


def _check_fraction(val_fraction: float) -> None:
    if not 0.0 < val_fraction < 1.0:
        raise UserError(f"data.val_fraction: must be between 0 and 1 (exclusive), got {val_fraction}")


def text_source(settings: DataSettings) -> Source:
    if settings.source == "shakespeare":
        return shakespeare_source()
    if settings.source == "files":
        return files_source(settings)
    if settings.source == "hf":
        return hf_source(settings)
    raise UserError(f"data.source: {settings.source!r} is not a text source; choose shakespeare, files or hf")


# -------------------------------------------------------------------------------- decoding


class _Replaced(threading.local):
    count = 0


_replaced = _Replaced()


def _count_and_replace(error: UnicodeDecodeError) -> tuple[str, int]:
    _replaced.count += error.end - error.start
    return "\ufffd", error.end


codecs.register_error("minitx-count-replace", _count_and_replace)


def decode(piece: Piece, errors: str) -> str:
    if isinstance(piece.data, str):
        return piece.data
    errors = "strict" if errors == "strict" else "minitx-count-replace"
    if piece.origin is None:
        return piece.data.decode("utf-8", errors)
    return piece.origin.decode(piece.data, piece.end[1], errors)
