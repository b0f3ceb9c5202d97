"""Prepare a dataset once: source -> tokenizer -> token shards on disk + a manifest, in bounded memory.

    stream pieces (streams.py) -> tokenise batches of pieces on `num_proc` threads -> shards

One directory per prepared dataset, `<cache_dir>/prepared/<key>/`, where the key hashes what
decides the ids (the source's paths or Hub name, the split rules, the tokenizer settings), not
the files' sizes and times: those are the *fingerprint*, stored in the manifest and compared at
every start (a stat per file, nothing read), so a changed source is prepared again, in place, with
one line saying why.

    manifest.json   written last, atomically: fingerprint, tokenizer, shards (name, ids, CRC-32,
                    size, mtime), per split the bytes and characters of text the ids spell
    progress.json   while preparing: the same, for the shards finished so far, and where in the
                    source to go on from. A prepare killed at any point resumes from there.
    train-00000.bin, val-00000.bin, ...   shards (shards.py), about `shard_tokens` ids each

Shards close together at *checkpoints*: when the training shard is full, every open shard is
finished and progress.json records the source position after the last piece they hold. A
manifest (or progress file) therefore never names an unfinished shard, and resuming re-reads
at most one shard's worth of text.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from minitx.data.shards import (
    ShardError,
    ShardHeader,
    ShardWriter,
    TokenArray,
    read_header,
    token_dtype,
    verify,
)
from minitx.data.sources import VAL_PLAYS, expand_globs, play_markdown_to_text, shakespeare_plays
from minitx.data.streams import (
    PIECE_BYTES,
    JoinedText,
    Piece,
    RecordSource,
    bytes_part,
    file_part,
    path_fingerprint,
    record_builder,
)
from minitx.data.tokenizer import CharTokenizer, HFTokenizer, Tokenizer, build_tokenizer, tokenizer_from_dict
from minitx.errors import UserError
from minitx.fileio import TMP_PREFIX, read_json, write_json_atomically

PREPARED_FORMAT = 1  # bump when the ids a setting gives, or the files, change: old directories are not reused
SHARD_TOKENS = 100_000_000
# Text per tokenizer call: big enough to amortise the call, small enough to bound memory.
BATCH_BYTES = 4 << 20
SAMPLE_WINDOW_BYTES = 1 << 20  # BPE's sample of a large text: windows this long, spread evenly
DECODE_ERRORS = ("strict", "replace")


@dataclass(frozen=True)
class DataSettings:
    """The data module's settings that decide what is prepared (and how fast)."""

    source: str = "shakespeare"
    train_files: str | list[str] | None = None
    val_files: str | list[str] | None = None
    val_fraction: float = 0.1
    hf_name: str | None = None
    hf_config: str | None = None
    hf_train_split: str = "train"
    hf_val_split: str | None = None
    hf_data_files: Any = None
    hf_revision: str | None = None
    text_column: str = "text"
    tokenizer: str = "char"
    vocab_size: int = 512
    tokenizer_train_bytes: int = 200_000_000
    max_tokens: int | None = None
    decode_errors: str = "strict"
    cache_dir: str | None = None
    num_proc: int | None = None
    shard_tokens: int = SHARD_TOKENS

    @classmethod
    def from_config(cls, data: Mapping[str, Any]) -> DataSettings:
        """The settings among a config's data section (which also holds batch sizes and the like);
        a key it lacks takes the default. The data module and evaluation (rebuilding a run's data
        from its checkpoint's config) both build them this way, so the two prepare the same data."""
        names = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in names})

    def threads(self) -> int:
        return self.num_proc or len(os.sched_getaffinity(0))


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
    segments: list[Segment]
    fingerprint: Callable[[], Any]  # cheap: stats, names and revisions, nothing read
    describe: str  # for messages, e.g. "data.train_files"
    val_hint: str = "raise data.val_fraction"


def _text_segment(split: str, parts: list, field_name: str) -> Segment:
    text = JoinedText(parts, field_name)
    if text.size == 0 or all(part.size == 0 for part in parts):
        raise UserError(f"{field_name}: the text is empty; add text")
    return Segment(split, text=text, start=0, end=text.size)


def _split_tail(text: JoinedText, val_fraction: float) -> list[Segment]:
    _check_fraction(val_fraction)
    # The tail from the exact fraction's point, moved to the nearest place where the text can be
    # cut (a line end): later if there is one, else earlier.
    point = int(text.size * (1.0 - val_fraction))
    if text.size - point < (1 << 20) and not text.read(point, 1 << 20).strip():
        raise UserError(
            "data.val_fraction: the validation set is empty; raise data.val_fraction or add more text"
        )
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
        raise UserError(
            "data.val_fraction: the validation set is empty; raise data.val_fraction or add more text"
        )
    return [
        Segment("train", text=text, start=0, end=cut),
        Segment("val", text=text, start=cut, end=text.size),
    ]


class _Deferred(list):
    """Segments made when a prepare first uses them: opening prepared data reads no text."""

    def __init__(self, make: Callable[[], list]) -> None:
        super().__init__()
        self._make: Callable[[], list] | None = make

    def _load(self) -> None:
        if self._make is not None:
            make, self._make = self._make, None
            self.extend(make())

    def __iter__(self):
        self._load()
        return super().__iter__()

    def __getitem__(self, index):
        self._load()
        return super().__getitem__(index)

    def __len__(self) -> int:
        self._load()
        return super().__len__()


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
        _Deferred(segments),
        lambda: [[Path(p).name, size, mtime] for p, size, mtime in path_fingerprint(paths)],
        "the built-in Shakespeare",
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
    if builder is not None:
        identity["text_column"] = settings.text_column

        def records(paths: list[Path], field_name: str) -> RecordSource:
            return RecordSource(
                builder, None, [str(p) for p in paths], "train", None, settings.text_column, field_name
            )

        if val_paths:
            segments = [
                Segment("train", records=records(train_paths, "data.train_files")),
                Segment("val", records=records(val_paths, "data.val_files")),
            ]
        else:
            _check_fraction(settings.val_fraction)
            segments = [Segment("mixed", records=records(train_paths, "data.train_files"))]
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
        else:
            _check_fraction(settings.val_fraction)
            segments = _Deferred(lambda: _split_tail(train_text, settings.val_fraction))
    all_paths = train_paths + val_paths
    return Source(
        identity,
        segments,
        lambda: path_fingerprint(all_paths),
        "data.train_files" + (" / data.val_files" if val_paths else ""),
        "add validation text" if val_paths else "raise data.val_fraction",
    )


def hf_source(settings: DataSettings) -> Source:
    if not settings.hf_name:
        raise UserError("data.hf_name: required when data.source=hf, e.g. 'roneneldan/TinyStories'")
    data_files = settings.hf_data_files
    local = _local_paths(data_files)

    def records(split: str, field_name: str) -> RecordSource:
        return RecordSource(
            settings.hf_name,
            settings.hf_config,
            data_files,
            split,
            settings.hf_revision,
            settings.text_column,
            field_name,
        )

    segments = [
        Segment(
            "train" if settings.hf_val_split else "mixed",
            records=records(settings.hf_train_split, "data.hf_train_split"),
        )
    ]
    if settings.hf_val_split:
        segments.append(Segment("val", records=records(settings.hf_val_split, "data.hf_val_split")))
    else:
        _check_fraction(settings.val_fraction)
    identity = {
        "source": "hf",
        "name": settings.hf_name,
        "config": settings.hf_config,
        "splits": [settings.hf_train_split, settings.hf_val_split],
        "val_fraction": None if settings.hf_val_split else settings.val_fraction,
        "data_files": data_files if not local else [str(Path(p).resolve()) for p in local],
        "revision": settings.hf_revision,
        "text_column": settings.text_column,
    }
    # A Hub dataset is named by its name, config, splits and revision: starting on prepared data
    # needs no network. Pin data.hf_revision to a commit to be sure the data never moves.
    return Source(
        identity,
        segments,
        (lambda: path_fingerprint(local)) if local else (lambda: dict(identity)),
        "data.hf_name",
        "add a validation split" if settings.hf_val_split else "raise data.val_fraction",
    )


def _blank(path: Path, field_name: str) -> bool:
    """Whether a text file holds nothing but whitespace (only small files are read to tell)."""
    try:
        size = path.stat().st_size
        return size == 0 or (size <= 4096 and not path.read_bytes().strip())
    except OSError as err:
        raise UserError(f"{field_name}: cannot read {str(path)!r} ({err.strerror}); check the file") from None


def _local_paths(data_files: Any) -> list[Path]:
    values: list = []
    if isinstance(data_files, str):
        values = [data_files]
    elif isinstance(data_files, list):
        values = data_files
    elif isinstance(data_files, dict):
        for value in data_files.values():
            values.extend([value] if isinstance(value, str) else value)
    paths = [Path(os.path.expanduser(v)) for v in values]
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


# -------------------------------------------------------------------------------- the directory


def _key(identity: dict, tokenizer_identity: dict) -> str:
    canonical = json.dumps([PREPARED_FORMAT, identity, tokenizer_identity], sort_keys=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:20]


def _tokenizer_identity(settings: DataSettings) -> dict:
    kind = settings.tokenizer
    if kind == "char":
        return {"kind": "char", "decode_errors": settings.decode_errors}
    if kind == "bpe":
        return {
            "kind": "bpe",
            "vocab_size": settings.vocab_size,
            "train_bytes": settings.tokenizer_train_bytes,
            "decode_errors": settings.decode_errors,
        }
    path = Path(os.path.expanduser(kind))
    return {"kind": "file", "path": str(path.resolve()), "decode_errors": settings.decode_errors}


def _fingerprint(source: Source, settings: DataSettings) -> Any:
    """The source's fingerprint, with a tokenizer.json's when the tokenizer is one (editing the file
    prepares the data again, as editing the text does)."""
    found = source.fingerprint()
    tokenizer = _tokenizer_identity(settings)
    if tokenizer["kind"] != "file" or not os.path.isfile(tokenizer["path"]):
        return found  # a missing tokenizer.json is named when it is loaded
    stats = path_fingerprint([Path(tokenizer["path"])])
    return found + stats if isinstance(found, list) else {**found, "tokenizer_file": stats}


def cache_root(cache_dir: str | os.PathLike | None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(base).expanduser() / "minitx"


@dataclass
class Prepared:
    """A prepared dataset, opened: the tokenizer and each split's ids as one array over its shards."""

    directory: Path
    tokenizer: Tokenizer
    train: TokenArray
    val: TokenArray
    manifest: dict = field(repr=False)

    def text_size(self, split: str) -> tuple[int, int]:
        """(characters, bytes) of the text the split's ids spell."""
        info = self.manifest["splits"][split]
        return int(info["characters"]), int(info["bytes"])


def _stat_shard(path: Path) -> dict:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _checked_header(directory: Path, shard: dict) -> ShardHeader:
    """The header of a shard the manifest names, checked against it (cheap: a stat and the header);
    ShardError says why the shard cannot be used as it is."""
    path = directory / shard["file"]
    try:
        if _stat_shard(path) != {"size": shard["size"], "mtime_ns": shard["mtime_ns"]}:
            raise ShardError("its size or modification time is not the one recorded when it was written")
    except FileNotFoundError:
        raise ShardError("it is missing") from None
    header = read_header(path)
    if header.count != shard["tokens"] or header.crc32 != shard["crc32"]:
        raise ShardError("its header does not match the manifest")
    return header


def _shard_problem(directory: Path, shard: dict) -> str | None:
    """Why a shard the manifest names cannot be used as it is, or None."""
    try:
        _checked_header(directory, shard)
    except ShardError as error:
        return str(error)
    return None


def _open(directory: Path, manifest: dict, headers: dict[str, ShardHeader] | None = None) -> Prepared:
    """The prepared data of a manifest; `headers` (by file name), when given, are its shards'
    headers already read and checked, so that opening does not read them again."""
    tokenizer = tokenizer_from_dict(manifest["tokenizer"])
    arrays = {}
    for split in ("train", "val"):
        names = [
            shard["file"]
            for checkpoint in manifest["checkpoints"]
            for shard in checkpoint["shards"]
            if shard["split"] == split
        ]
        arrays[split] = TokenArray(
            [directory / name for name in names],
            vocab_size=tokenizer.vocab_size,
            headers=None if headers is None else [headers[name] for name in names],
        )
    return Prepared(directory, tokenizer, arrays["train"], arrays["val"], manifest)


@contextlib.contextmanager
def _locked(directory: Path, log: Callable[[str], None]) -> Iterator[None]:
    """One prepare of a dataset at a time; a second waits for the first and then uses its result."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.with_name(directory.name + ".lock"), "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            log(f"minitx: {directory} is being prepared by {holder}; waiting for it to finish")
            fcntl.flock(lock, fcntl.LOCK_EX)
        lock.seek(0)
        lock.truncate()
        lock.write(f"process {os.getpid()}")
        lock.flush()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def prepare(settings: DataSettings, log: Callable[[str], None] = _stderr, progress: bool = True) -> Prepared:
    """The prepared dataset for `settings`: opened at once when current, else (re)prepared first."""
    if settings.decode_errors not in DECODE_ERRORS:
        raise UserError(
            f"data.decode_errors: {settings.decode_errors!r} is not one of {', '.join(DECODE_ERRORS)}"
        )
    if settings.shard_tokens < 1:
        raise UserError(f"data.shard_tokens: must be at least 1, got {settings.shard_tokens}")
    if settings.max_tokens is not None and settings.max_tokens < 1:
        raise UserError(f"data.max_tokens: must be at least 1 (or unset for all), got {settings.max_tokens}")
    source = text_source(settings)
    root = cache_root(settings.cache_dir)
    directory = (
        root
        / "prepared"
        / _key({**source.identity, "max_tokens": settings.max_tokens}, _tokenizer_identity(settings))
    )
    fingerprint = _fingerprint(source, settings)
    opened = _open_current(directory, fingerprint)  # the fast path: no lock, nothing read but stats
    if opened is not None:
        return opened
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(
            f"data.cache_dir: cannot create {str(directory)!r} ({err.strerror}); set data.cache_dir to a writable directory"
        ) from None
    # Memory: the commands' allocator settings (allocator.py) keep freed blocks for reuse, and the
    # blocks here are a few batches' worth, reused batch after batch (measured: 570 MB peak RSS
    # for 1 GB; returning every block to the kernel cost 30% more time in page faults).
    with _locked(directory, log):
        opened = _open_current(directory, fingerprint, log)  # another process may have just finished it
        if opened is not None:
            return opened
        return _prepare_locked(settings, source, directory, fingerprint, log, progress)


def _open_current(
    directory: Path, fingerprint: Any, log: Callable[[str], None] | None = None
) -> Prepared | None:
    manifest = read_json(directory / "manifest.json")
    if (
        manifest is None
        or manifest.get("format") != PREPARED_FORMAT
        or manifest.get("fingerprint") != fingerprint
    ):
        return None
    headers = {}
    for checkpoint in manifest["checkpoints"]:
        for shard in checkpoint["shards"]:
            try:
                headers[shard["file"]] = _checked_header(directory, shard)
            except ShardError:
                return None  # the locked pass below says what and prepares again from that shard
    return _open(directory, manifest, headers)


def _changed(old: Any, new: Any) -> str:
    if isinstance(old, list) and isinstance(new, list):
        before = {entry[0]: entry[1:] for entry in old if isinstance(entry, list) and entry}
        after = {entry[0]: entry[1:] for entry in new if isinstance(entry, list) and entry}
        for name in after:
            if name not in before:
                return f"{name} is new"
            if before[name] != after[name]:
                return f"{name} has a new size or modification time"
        for name in before:
            if name not in after:
                return f"{name} is gone"
    return "its fingerprint changed"


def _prepare_locked(
    settings: DataSettings, source: Source, directory: Path, fingerprint: Any, log, progress: bool
) -> Prepared:
    for stale in directory.glob(TMP_PREFIX + "*"):  # left by a prepare that was killed mid-shard
        stale.unlink(missing_ok=True)
    state = read_json(directory / "manifest.json") or read_json(directory / "progress.json")
    repaired = False  # a damaged shard was named: that one line also says where it goes on from
    if state is None and any(directory.glob("*.bin")):
        log(
            f"minitx: {directory} holds shards but no readable manifest.json or progress.json; preparing it again"
        )
    if (
        state is not None
        and state.get("format") == PREPARED_FORMAT
        and state.get("fingerprint") != fingerprint
    ):
        log(
            f"minitx: {source.describe} changed since it was prepared ({_changed(state.get('fingerprint'), fingerprint)}); preparing it again"
        )
        state = None
    elif state is not None and state.get("format") == PREPARED_FORMAT:
        kept = []
        for checkpoint in state["checkpoints"]:
            problems = [(s["file"], _shard_problem(directory, s)) for s in checkpoint["shards"]]
            bad = [(name, why) for name, why in problems if why is not None]
            if bad:
                log(
                    f"minitx: the shard {directory / bad[0][0]} cannot be used ({bad[0][1]}); preparing again from it"
                )
                repaired = True
                break
            kept.append(checkpoint)
        state = {**state, "checkpoints": kept}
        # Shards no checkpoint names: finished and renamed just before a kill, or after a damaged
        # one. The resumed prepare writes them again.
        named = {shard["file"] for checkpoint in kept for shard in checkpoint["shards"]}
        for orphan in directory.glob("*.bin"):
            if orphan.name not in named:
                orphan.unlink()
    else:
        state = None
    if state is None:
        for entry in directory.iterdir():
            entry.unlink() if entry.is_file() else shutil.rmtree(entry)
        tokenizer = _fit_tokenizer(settings, source, log)
        state = {
            "format": PREPARED_FORMAT,
            "identity": source.identity,
            "settings": {"tokenizer": settings.tokenizer, "max_tokens": settings.max_tokens},
            "fingerprint": fingerprint,
            "tokenizer": tokenizer.to_dict(),
            "checkpoints": [],
            "replaced_bytes": 0,
        }
        write_json_atomically(directory / "progress.json", state)
    else:
        (directory / "manifest.json").unlink(missing_ok=True)
        write_json_atomically(directory / "progress.json", state)
        if state["checkpoints"] and not repaired:
            tokens = sum(s["tokens"] for c in state["checkpoints"] for s in c["shards"])
            log(f"minitx: resuming the prepare of {directory} after its finished shards ({tokens:,} tokens)")
        tokenizer = tokenizer_from_dict(state["tokenizer"])
    try:
        _encode(settings, source, directory, tokenizer, state, log, progress)
    except _NoRoom:
        raise
    except UserError:
        # Bad input (invalid UTF-8, a file changed under us): nothing of this attempt is kept.
        shutil.rmtree(directory, ignore_errors=True)
        raise
    now = _fingerprint(source, settings)
    if now != fingerprint:
        shutil.rmtree(directory, ignore_errors=True)
        raise UserError(
            f"{source.describe}: {_changed(fingerprint, now)} while it was being prepared; "
            "run again once it is complete"
        )
    manifest = _finish_manifest(state, source)
    write_json_atomically(directory / "manifest.json", manifest)
    (directory / "progress.json").unlink(missing_ok=True)
    return _open(directory, manifest)


def _finish_manifest(state: dict, source: Source) -> dict:
    splits = {}
    for split in ("train", "val"):
        shards = [s for c in state["checkpoints"] for s in c["shards"] if s["split"] == split]
        splits[split] = {key: sum(s[key] for s in shards) for key in ("tokens", "bytes", "characters")}
        splits[split]["shards"] = len(shards)
    if splits["val"]["tokens"] == 0:
        raise UserError(f"data: the validation set is empty; {source.val_hint}")
    return {**state, "splits": splits}


# -------------------------------------------------------------------------------- the tokenizer


def _fit_tokenizer(settings: DataSettings, source: Source, log) -> Tokenizer:
    kind = settings.tokenizer
    if kind == "char":
        return CharTokenizer(_alphabet(settings, source))
    if kind == "bpe":
        from minitx.data.tokenizer import train_bpe

        _set_threads(settings.threads())
        return train_bpe(_bpe_sample(settings, source), settings.vocab_size)
    return build_tokenizer(kind, "", settings.vocab_size)


def _set_threads(threads: int) -> None:
    # The tokenizers library sizes its thread pool once, from this variable, at first use.
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))


def _alphabet(settings: DataSettings, source: Source) -> str:
    """Every character of the whole source, train and validation: a character vocabulary is an
    alphabet, and fitting it on both splits means a validation character always encodes."""

    known = bytearray()  # ASCII characters found so far: deleted from each piece before looking

    def characters(batch: list[Piece]) -> set[str]:
        # bytes.translate deletes the known characters at memory speed; what is left is short once
        # the alphabet is found, and ASCII bytes never occur inside a multi-byte UTF-8 character,
        # so the rest still decodes.
        found: set[str] = set()
        for piece in batch:
            data = piece.data if isinstance(piece.data, bytes) else piece.data.encode("utf-8")
            rest = data.translate(None, bytes(known))
            if not rest:
                continue
            try:
                found.update(rest.decode("utf-8"))
            except UnicodeDecodeError:
                found.update(decode(piece, settings.decode_errors))  # says where, or replaces
        return found

    seen: set[str] = set()
    pieces = _pieces(source, [0, 0], settings, BATCH_BYTES)
    for found in _ordered_map(characters, _batches(pieces, BATCH_BYTES), settings.threads()):
        seen |= found
        known[:] = bytes(sorted(ord(c) for c in seen if ord(c) < 0x80))
    if not seen:
        raise UserError(
            f"data: {source.describe} holds no text (data.text_column={settings.text_column!r} for records)"
        )
    if any(segment.records is not None for segment in source.segments):
        seen.add("\n")  # records are separated by a newline (no end-of-text token)
    return "".join(sorted(seen))


def _bpe_sample(settings: DataSettings, source: Source) -> Iterator[str]:
    """At most tokenizer_train_bytes of training text, drawn from across the corpus: windows of
    1 MB spread evenly over each text (all of it when it is smaller); records from the start."""
    budget = settings.tokenizer_train_bytes
    for segment in source.segments:
        if segment.split == "val":
            continue
        if segment.records is not None:
            for piece in segment.pieces(0, 0, settings.val_fraction, PIECE_BYTES):
                if piece.split == "train":
                    text = decode(piece, settings.decode_errors)
                    yield text
                    budget -= len(text)
                    if budget <= 0:
                        return
            continue
        assert segment.text is not None
        size = segment.end - segment.start
        if size <= budget:
            for end, data in segment.text.pieces(segment.start, segment.end):
                yield decode(Piece("train", data, [0, end], origin=segment.text), settings.decode_errors)
            budget -= size
            continue
        window = SAMPLE_WINDOW_BYTES
        count = max(1, budget // window)
        for i in range(count):
            lo = segment.text.cut_at_or_after(segment.start + i * size // count)
            hi = segment.text.cut_at_or_after(min(segment.end, lo + window))
            for end, data in segment.text.pieces(lo, min(hi, segment.end)):
                yield decode(Piece("train", data, [0, end], origin=segment.text), settings.decode_errors)
        return


# -------------------------------------------------------------------------------- encoding


def _pieces(source: Source, position: list[int], settings: DataSettings, piece_bytes: int) -> Iterator[Piece]:
    first_segment, offset = position
    for index, segment in enumerate(source.segments):
        if index < first_segment:
            continue
        start = offset if index == first_segment else 0
        yield from segment.pieces(index, start, settings.val_fraction, piece_bytes)


def _batches(pieces: Iterable[Piece], batch_bytes: int) -> Iterator[list[Piece]]:
    batch: list[Piece] = []
    size = 0
    for piece in pieces:
        batch.append(piece)
        size += len(piece.data)
        if size >= batch_bytes:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _ordered_map(function: Callable, items: Iterable, threads: int) -> Iterator:
    """function(item) for each item on `threads` threads, in order, with at most 2 x threads in flight."""
    with ThreadPoolExecutor(max_workers=threads) as pool:
        pending: deque = deque()
        for item in items:
            pending.append(pool.submit(function, item))
            if len(pending) >= 2 * threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


@dataclass
class Encoded:
    """A batch's ids by split, the text they spell, and where the source goes on after it."""

    ids: dict[str, list[np.ndarray]]
    marked: dict[str, bool]  # the split's ids start with a newline put between records (see _encoder)
    characters: dict[str, int]
    bytes: dict[str, int]
    replaced: int
    end: list[int]
    source_bytes: int


def _encoder(tokenizer: Tokenizer, settings: DataSettings) -> Callable[[list[Piece]], Encoded]:
    eos = tokenizer.eos_id
    newline = (
        tokenizer.encode("\n") if isinstance(tokenizer, CharTokenizer) and "\n" in tokenizer.chars else None
    )
    dtype = token_dtype(tokenizer.vocab_size)

    def encode(batch: list[Piece]) -> Encoded:
        _replaced.count = 0
        out = Encoded(
            {"train": [], "val": []}, {}, {"train": 0, "val": 0}, {"train": 0, "val": 0}, 0, batch[-1].end, 0
        )
        encoded: list[np.ndarray] = []
        texts: list[str] = []
        for piece in batch:
            size = len(piece.data) if isinstance(piece.data, bytes) else len(piece.data.encode("utf-8"))
            out.source_bytes += size
            out.bytes[piece.split] += size
            if isinstance(tokenizer, CharTokenizer):  # one id per character: no decoding to count them
                try:
                    ids = tokenizer.encode_utf8(piece.data)
                except UnicodeDecodeError:  # say where (strict), or replace and count
                    ids = tokenizer.encode_utf8(decode(piece, settings.decode_errors))
                encoded.append(ids)
                out.characters[piece.split] += ids.size
                continue
            text = decode(piece, settings.decode_errors)
            texts.append(text)
            out.characters[piece.split] += len(text)
        if texts:
            assert isinstance(tokenizer, HFTokenizer)
            encoded = [np.asarray(ids, dtype=dtype) for ids in tokenizer.encode_pieces(texts)]
        for piece, ids in zip(batch, encoded):
            if piece.first_of_document:
                # Documents from records: the end-of-text token before each; a tokenizer without
                # one gets a newline *between* records, as they were joined before (the writer
                # drops it before a split's first record).
                marker = [eos] if eos is not None else newline
                if marker is not None:
                    out.marked.setdefault(piece.split, eos is None)
                    out.ids[piece.split].append(np.asarray(marker, dtype=dtype))
            out.marked.setdefault(piece.split, False)
            out.ids[piece.split].append(ids.astype(dtype, copy=False))
        out.replaced = _replaced.count
        return out

    return encode


class _Progress:
    """One line on stderr: MB read, MB/s, tokens, ETA (rewritten in place on a terminal)."""

    def __init__(self, total_bytes: int | None, total_tokens: int | None, enabled: bool) -> None:
        self.total_bytes, self.total_tokens = total_bytes, total_tokens
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.start = self.last = time.monotonic()
        self.bytes = self.tokens = 0
        self.shown = False

    def update(self, source_bytes: int, tokens: int, final: bool = False) -> None:
        self.bytes += source_bytes
        self.tokens += tokens
        now = time.monotonic()
        if not self.enabled or (not final and now - self.last < (0.5 if self.tty else 15.0)):
            return
        if final and not self.shown and now - self.start < 2.0:
            return  # a prepare of a second or two needs no report (the quickstart's Shakespeare)
        self.shown = True
        self.last = now
        elapsed = max(now - self.start, 1e-9)
        rate = self.bytes / elapsed
        line = f"prepare: {self.bytes / 1e6:,.1f} MB"
        if self.total_bytes:
            line += f" of {self.total_bytes / 1e6:,.1f}"
        line += f", {rate / 1e6:.1f} MB/s, {self.tokens:,} tokens"
        left = None
        if self.total_bytes and rate > 0:
            left = (self.total_bytes - self.bytes) / rate
        elif self.total_tokens and self.tokens:
            left = (self.total_tokens - self.tokens) * elapsed / self.tokens
        if left is not None and not final:
            line += f", ETA {int(left) // 60}:{int(left) % 60:02d}"
        if final:
            line += f" in {elapsed:.1f} s"
        end = "\n" if final or not self.tty else ""
        print(("\r" if self.tty else "") + line, end=end, file=sys.stderr, flush=True)


class _Shards:
    """The open shard of each split; `checkpoint()` finishes them and records where the source goes on."""

    def __init__(self, directory: Path, dtype: np.dtype, state: dict) -> None:
        self.directory, self.dtype, self.state = directory, dtype, state
        done = [s for c in state["checkpoints"] for s in c["shards"]]
        self.next_index = {split: sum(1 for s in done if s["split"] == split) for split in ("train", "val")}
        self.writers: dict[str, ShardWriter] = {}
        self.text: dict[str, dict[str, int]] = {}
        self.tokens = {
            split: sum(s["tokens"] for s in done if s["split"] == split) for split in ("train", "val")
        }

    def write(self, split: str, ids: list[np.ndarray], characters: int, size: int) -> Callable[[], None]:
        """Count the ids into the split's open shard now; returns the call that writes them, which
        may run on another thread (one at a time, in order, before the next checkpoint)."""
        if split not in self.writers:
            name = f"{split}-{self.next_index[split]:05d}.bin"
            self.writers[split] = ShardWriter(self.directory / name, self.dtype)
            self.text[split] = {"characters": 0, "bytes": 0, "tokens": 0}
            self.next_index[split] += 1
        writer = self.writers[split]
        self.text[split]["characters"] += characters
        self.text[split]["bytes"] += size
        self.text[split]["tokens"] += sum(a.size for a in ids)
        self.tokens[split] += sum(a.size for a in ids)

        def write() -> None:
            for array in ids:
                _disk_safe(writer.write, array)

        return write

    def open_tokens(self, split: str) -> int:
        return self.text[split]["tokens"] if split in self.writers else 0

    def checkpoint(self, position: list[int], replaced: int) -> None:
        shards = []
        for split, writer in sorted(self.writers.items()):
            header = _disk_safe(writer.finish)
            path = writer.path
            shards.append(
                {
                    "split": split,
                    "file": path.name,
                    "tokens": header.count,
                    "crc32": header.crc32,
                    "characters": self.text[split]["characters"],
                    "bytes": self.text[split]["bytes"],
                    **_stat_shard(path),
                }
            )
        self.writers.clear()
        self.state["checkpoints"].append({"position": position, "shards": shards})
        self.state["replaced_bytes"] += replaced
        _disk_safe(write_json_atomically, self.directory / "progress.json", self.state)

    def abort(self) -> None:
        for writer in self.writers.values():
            writer.abort()
        self.writers.clear()


class _NoRoom(UserError):
    """The disk filled up: unlike bad input, the shards already finished are kept to resume from."""


def _disk_safe(function: Callable, *args):
    try:
        return function(*args)
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise _NoRoom(
                f"data.cache_dir: no room left to write a shard ({os.strerror(err.errno)}); free space or set "
                "data.cache_dir to a disk with room, then run again (the shards already finished are kept)"
            ) from None
        raise


def _encode(
    settings: DataSettings,
    source: Source,
    directory: Path,
    tokenizer: Tokenizer,
    state: dict,
    log,
    progress: bool,
) -> None:
    position = state["checkpoints"][-1]["position"] if state["checkpoints"] else [0, 0]
    shards = _Shards(directory, token_dtype(tokenizer.vocab_size), state)
    total = None
    if all(s.text is not None for s in source.segments):  # records: their size is known only at the end
        first, offset = position
        total = sum(
            s.end - max(s.start, offset if i == first else s.start)
            for i, s in enumerate(source.segments)
            if i >= first
        )
    bar = _Progress(total, settings.max_tokens, progress)
    if not isinstance(tokenizer, CharTokenizer):
        _set_threads(settings.threads())
    # Char: many threads each look up a whole batch. BPE: the tokenizers library spreads one
    # batch's pieces over its own threads, and a second batch in flight hides the reading.
    threads = settings.threads() if isinstance(tokenizer, CharTokenizer) else 2
    piece_bytes = BATCH_BYTES // 4 if isinstance(tokenizer, CharTokenizer) else PIECE_BYTES
    encode = _encoder(tokenizer, settings)
    replaced = 0
    last_end = position
    # Writing (and its CRC-32) runs on a thread of its own, overlapping the next batch's reading
    # and tokenising; one write in flight, always finished before a checkpoint.
    io = ThreadPoolExecutor(max_workers=1)
    pending = None
    try:
        # BPE's batches are smaller: the library's encodings of a batch take ~100 bytes a token.
        batch_bytes = BATCH_BYTES if isinstance(tokenizer, CharTokenizer) else BATCH_BYTES // 4
        batches = _batches(_pieces(source, position, settings, piece_bytes), batch_bytes)
        for encoded in _ordered_map(encode, batches, threads):
            done = False
            writes = []
            for split in ("train", "val"):
                ids = [a for a in encoded.ids[split] if a.size]
                if ids and encoded.marked.get(split) and shards.tokens[split] == 0:
                    ids[0] = ids[0][1:]
                if split == "train" and settings.max_tokens is not None:
                    room = settings.max_tokens - shards.tokens["train"]
                    if sum(a.size for a in ids) >= room:
                        ids, done = [np.concatenate(ids)[:room]], True
                if sum(a.size for a in ids):
                    writes.append(shards.write(split, ids, encoded.characters[split], encoded.bytes[split]))
            if pending is not None:
                pending.result()
            pending = io.submit(lambda calls=writes: [call() for call in calls])
            replaced += encoded.replaced
            last_end = encoded.end
            bar.update(encoded.source_bytes, sum(sum(a.size for a in v) for v in encoded.ids.values()))
            if done:
                break
            if shards.open_tokens("train") >= settings.shard_tokens:
                pending.result()
                shards.checkpoint(last_end, replaced)
                replaced = 0
        if pending is not None:
            pending.result()
        if shards.writers:
            shards.checkpoint(last_end, replaced)
    except BaseException:
        if pending is not None:
            pending.cancel() or pending.exception()  # the writer must be idle before its file goes
        shards.abort()
        raise
    finally:
        io.shutdown(wait=True)
    bar.update(0, 0, final=True)
    if state["replaced_bytes"]:
        log(
            f"minitx: replaced {state['replaced_bytes']:,} bytes of invalid UTF-8 with U+FFFD (data.decode_errors=replace)"
        )


# -------------------------------------------------------------------------------- checking


def verify_prepared(prepared: Prepared, log: Callable[[str], None] = _stderr) -> list[str]:
    """Every shard's checksum and ids against the manifest: the problems found (none: all good)."""
    problems = []
    for checkpoint in prepared.manifest["checkpoints"]:
        for shard in checkpoint["shards"]:
            path = prepared.directory / shard["file"]
            try:
                header = verify(path, prepared.tokenizer.vocab_size)
                if header.crc32 != shard["crc32"] or header.count != shard["tokens"]:
                    raise ShardError("its header does not match the manifest")
            except ShardError as error:
                problems.append(f"{path}: {error}")
    for problem in problems:
        log(f"verify: {problem}")
    log(
        f"verify: {len(problems)} problem(s) in {sum(len(c['shards']) for c in prepared.manifest['checkpoints'])} shards"
    )
    return problems
