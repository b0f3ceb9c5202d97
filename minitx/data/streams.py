"""Every text source as a stream of pieces, never the whole text: what `prepare.py` tokenises.

Two kinds of source:

* **Texts** (plain files, the built-in Shakespeare): the parts (files, plays) are read as one byte
  string with b"\\n" between parts, as the whole-text path joined them, in blocks cut only where
  cutting cannot change the tokens (`next_cut`). A resume position is a byte offset in it.
* **Records** (jsonl, json, parquet, csv and arrow files, or a Hugging Face Hub dataset streamed):
  one document per record's text column; a resume position is the number of records read.

A stream yields `Piece(split, data, end, first_of_document)`: `data` is UTF-8 bytes (texts) or a
str (records); `end` is where to resume after it.
"""

from __future__ import annotations

import glob
import io
import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from minitx.errors import UserError, one_line
from minitx.network import require_hub

BLOCK_BYTES = 4 << 20  # a read from a text file
PIECE_BYTES = 1 << 16  # one tokenizer input: the tokenizers library needs many pieces to use its threads
MAX_LINE_BYTES = 16 << 20  # past this without a line end, cut between words (see next_cut)

RECORD_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}


@dataclass(frozen=True)
class Piece:
    split: str  # "train" or "val"
    data: bytes | str
    end: list[int]  # [segment, position]: where to resume after this piece
    first_of_document: bool = False  # records only: the tokenizer's end-of-text goes before it
    origin: JoinedText | None = None  # texts: where the bytes come from, to say where bad UTF-8 is


# -------------------------------------------------------------------------------- cutting


def _nonspace_before(buf: bytes | bytearray, i: int) -> bool:
    """Whether the character that ends just before byte i is not whitespace."""
    byte = buf[i - 1]
    if byte < 0x80:
        return 0x21 <= byte <= 0x7E
    start = i - 1
    while start > max(0, i - 4) and 0x80 <= buf[start] < 0xC0:
        start -= 1
    char = bytes(buf[start:i]).decode("utf-8", "replace")
    return bool(char) and not char[-1].isspace()


def _nonspace_at(buf: bytes | bytearray, i: int) -> bool:
    byte = buf[i]
    if byte < 0x80:
        return 0x21 <= byte <= 0x7E
    char = bytes(buf[i : i + 4]).decode("utf-8", "replace")
    return bool(char) and not char[0].isspace()


def next_cut(buf: bytes | bytearray, start: int, final: bool, line_start: int | None = None) -> int | None:
    """The first place at or after `start` where `buf` can be cut, or None if more bytes are needed.

    A cut goes after a newline that has a non-space character on each side: no pre-tokenizer we
    use joins a newline to the next word, and a lone newline is split off the same way at the end
    of a piece as in the middle, so encoding piece by piece gives exactly the ids of the whole.
    A text with no line end for MAX_LINE_BYTES (a multi-GB single line) is cut before a space that
    follows a non-space ASCII character, else at any character boundary. `final`: no more bytes
    will come, so the end of `buf` is a cut. The tokenizer cuts a text it encodes whole into
    chunks here too (tokenizer._chunks).
    """
    search = max(start - 1, 1)  # a cut exactly at `start` counts
    while True:
        newline = buf.find(b"\n", search)
        if newline < 0 or newline + 1 >= len(buf):
            break
        if _nonspace_before(buf, newline) and _nonspace_at(buf, newline + 1):
            return newline + 1
        search = newline + 1
    if final:
        return len(buf)
    # No line end: cut between words only once a line has run on for MAX_LINE_BYTES.
    if len(buf) - (start if line_start is None else line_start) < MAX_LINE_BYTES:
        return None
    if (space := _word_cut(buf, start)) > 0:
        return space
    cut = start
    while cut < len(buf) and 0x80 <= buf[cut] < 0xC0:  # a UTF-8 continuation byte: not a character boundary
        cut += 1
    return cut


def _word_cut(buf: bytes | bytearray, start: int) -> int:
    """The first space after `start` that follows a non-space ASCII character, or -1."""
    space = buf.find(b" ", start + 1)
    while space > 0:
        if 0x21 <= buf[space - 1] <= 0x7E:
            return space
        space = buf.find(b" ", space + 1)
    return -1


# -------------------------------------------------------------------------------- texts


@dataclass
class TextPart:
    name: str  # a path, or the name of a built-in text, for messages
    size: int
    open: Callable[[], BinaryIO]  # the part's bytes as a binary file, closed by the reader


def file_part(path: Path) -> TextPart:
    return TextPart(str(path), path.stat().st_size, lambda: open(path, "rb"))


def bytes_part(name: str, data: bytes) -> TextPart:
    return TextPart(name, len(data), lambda: io.BytesIO(data))


class JoinedText:
    """Parts read as one byte string with b"\\n" between consecutive parts."""

    def __init__(self, parts: Sequence[TextPart], field: str) -> None:
        self.field = field  # the config key that names these parts, for messages
        self.parts = list(parts)
        offsets = list(itertools.accumulate((part.size + 1 for part in self.parts), initial=0))
        self.starts, self.size = offsets[:-1], max(0, offsets[-1] - 1)  # parts and their separators

    def locate(self, offset: int) -> tuple[str, int]:
        """(part name, byte offset inside it) of an offset in the joined text."""
        index = max(i for i, start in enumerate(self.starts) if start <= offset) if self.starts else 0
        return self.parts[index].name, offset - self.starts[index]

    def blocks(self, start: int, end: int) -> Iterator[bytes]:
        """The bytes start .. end - 1, in blocks of at most BLOCK_BYTES."""
        for index, part in enumerate(self.parts):
            part_start, part_end = self.starts[index], self.starts[index] + part.size
            if index and start < part_start <= end:
                yield b"\n"  # the separator before this part
            lo, hi = max(start, part_start), min(end, part_end)
            if lo >= hi:
                continue
            with part.open() as file:
                file.seek(lo - part_start)
                remaining = hi - lo
                while remaining:
                    block = file.read(min(BLOCK_BYTES, remaining))
                    if not block:
                        raise UserError(f"data: {part.name!r} became shorter while it was read; run again")
                    remaining -= len(block)
                    yield block

    def decode(self, data: bytes, end: int, errors: str) -> str:
        """The bytes that end at offset `end`, as text; invalid UTF-8 is a UserError saying where."""
        try:
            return data.decode("utf-8", errors)
        except UnicodeDecodeError as err:
            name, offset = self.locate(end - len(data) + err.start)
            raise UserError(
                f"{self.field}: {name!r} is not UTF-8 text at byte {offset} ({err.reason}); convert it to "
                "UTF-8, or set data.decode_errors replace to replace such bytes with U+FFFD"
            ) from None

    def read(self, start: int, length: int) -> bytes:
        return b"".join(self.blocks(start, min(self.size, start + length)))

    def cut_at_or_after(self, offset: int) -> int:
        """The first cut (next_cut) at or after `offset`; the end of the text if there is none."""
        if offset <= 0:
            return 0
        window = 1 << 16
        while True:
            data = self.read(offset - 1, window)
            final = offset - 1 + len(data) >= self.size
            if (cut := next_cut(data, 1, final)) is not None:
                return offset - 1 + cut
            window *= 4

    def cut_at_or_before(self, offset: int) -> int:
        """The last cut (next_cut) at or before `offset`; 0 if there is none."""
        window = 1 << 16
        while True:
            low = max(0, offset - window)
            data = self.read(low, offset - low + 1)
            last, position = 0, 1
            while (cut := next_cut(data, position, final=False)) is not None and low + cut <= offset:
                last, position = low + cut, cut + 1
            if last or low == 0:
                return last
            window *= 4

    def word_cut_at_or_after(self, offset: int) -> int:
        """Before the first space at or after `offset` that follows a non-space ASCII character
        (see next_cut); the end of the text if there is none."""
        low = max(offset - 1, 0)
        space = _word_cut(self.read(low, MAX_LINE_BYTES), 0)
        return low + space if space > 0 else self.size

    def pieces(self, start: int, end: int, piece_bytes: int = PIECE_BYTES) -> Iterator[tuple[int, bytes]]:
        """(end offset, bytes) of consecutive pieces of about piece_bytes covering start .. end.

        Each block read is cut into pieces in place; only the tail after the last cut is carried
        into the next block (a few bytes, or up to a line's length).
        """
        carry = b""
        offset = start  # where `data` begins in the joined text
        for block in self.blocks(start, end):
            data = carry + block if carry else block
            position = 0
            while len(data) - position > piece_bytes:
                cut = next_cut(data, position + piece_bytes, final=False, line_start=position)
                if cut is None:
                    break
                yield offset + cut, data[position:cut]
                position = cut
            carry = data[position:]
            offset += position
        position = 0
        while position < len(carry):
            cut = next_cut(carry, min(position + piece_bytes, len(carry)), final=True, line_start=position)
            yield offset + cut, carry[position:cut]
            position = cut


# -------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class RecordSource:
    """`datasets.load_dataset(path, name, data_files=..., split=..., revision=..., streaming=True)`."""

    path: str  # a builder ("json", "parquet", ...) or a Hub dataset's name
    name: str | None
    data_files: Any
    split: str
    revision: str | None
    text_column: str
    field: str  # the config key a failure names

    def documents(self, skip: int = 0) -> Iterator[str]:
        """The text of every record from record `skip` on ('' for a missing or empty text)."""
        if self.on_hub():
            require_hub(
                "data.hf_name",
                f"streaming {self.path!r} from the Hugging Face Hub",
                "run where the Hub is reachable (prepare.py ahead of time), or point data.train_files at a "
                "local copy (jsonl, parquet, csv or arrow)",
            )
        import datasets

        try:
            dataset = datasets.load_dataset(
                self.path,
                self.name,
                data_files=self.data_files,
                split=self.split,
                revision=self.revision,
                streaming=True,
            )
            batches = iter((dataset.skip(skip) if skip else dataset).iter(batch_size=1024))
            first = next(batches, None)
        except UserError:
            raise
        except FileNotFoundError as err:
            if self.data_files:  # a local file is missing: the field that names the files
                field = self.field if self.field.endswith("_files") else "data.hf_data_files"
                raise UserError(f"{field}: {one_line(err)}; check the path") from None
            raise UserError(
                f"data.hf_name: no dataset {self.path!r} found ({one_line(err)}); check the name"
            ) from None
        except ValueError as err:  # an unknown split or config
            raise UserError(
                f"{self.field}: cannot load split {self.split!r} of {self.path!r}: {one_line(err)}"
            ) from None
        except OSError as err:  # a connection or a timeout among them
            raise self._offline(err) from None
        except Exception as err:  # the Hub client's own errors (offline mode, HTTP failures)
            if any(word in str(err).lower() for word in ("offline", "connect", "resolve")):
                raise self._offline(err) from None
            raise UserError(f"{self.field}: cannot read {self.path!r}: {one_line(err, 300)}") from None
        if first is None:
            return
        if self.text_column not in first:
            raise UserError(
                f"data.text_column: {self.where()} has no column {self.text_column!r}; its columns are {sorted(first)}"
            )
        for batch in itertools.chain([first], batches):
            for text in batch[self.text_column]:
                yield text if isinstance(text, str) else ""

    def on_hub(self) -> bool:
        """Whether reading this source streams a dataset from the Hub: not a builder that
        `datasets` ships (json, text, parquet, ...) over local data_files."""
        from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

        if self.path in _PACKAGED_DATASETS_MODULES or self.path in RECORD_FORMATS.values():
            return False
        names = data_file_names(self.data_files)
        return not self.data_files or not all(glob.glob(os.path.expanduser(str(name))) for name in names)

    def where(self) -> str:
        return repr(self.data_files) if self.data_files else f"{self.path!r} (split {self.split!r})"

    def _offline(self, err: BaseException) -> UserError:
        return UserError(
            f"data.hf_name: cannot stream {self.path!r} from the Hugging Face Hub ({one_line(err, 200)}); "
            "it needs the network, or point data.train_files at a local copy (jsonl, parquet, csv or arrow)"
        )


def record_builder(paths: Sequence[Path], field: str) -> str | None:
    """The `datasets` builder that reads these files, or None for plain text files."""
    kinds = {RECORD_FORMATS.get(path.suffix.lower()) for path in paths}
    if len(kinds) > 1:
        named = sorted(kind or "plain text" for kind in kinds)
        raise UserError(f"{field}: mixes kinds of files ({', '.join(named)}); give one kind per field")
    return kinds.pop()


def data_file_names(data_files: Any) -> list:
    """The names (or globs) of a `datasets` data_files: a name, a list of them, or either by split."""
    values = data_files.values() if isinstance(data_files, dict) else [data_files] if data_files else []
    names = [name for value in values for name in (value if isinstance(value, (list, tuple)) else [value])]
    # A YAML number or the like: refused here, in one line, not as a TypeError deep inside a prepare.
    if not all(isinstance(name, (str, os.PathLike)) for name in names):
        raise UserError(
            f"data.hf_data_files: is {data_files!r}; give a file or glob, a list of them, or a mapping "
            "of split names to them (e.g. {train: data/train.jsonl})"
        )
    return names


def path_fingerprint(paths: Sequence[Path]) -> list[list[Any]]:
    """[[absolute path, size, modification time in ns], ...]: what decides that a file is unchanged."""
    stats = [(path, os.stat(path)) for path in paths]
    return [[str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns] for path, stat in stats]
