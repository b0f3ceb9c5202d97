"""Token shards: the on-disk format of prepared data, and the arrays training reads from it.

A shard is one file of token ids, written once and never changed:

    offset  size  field
         0     8  magic b"MINITXTK"
         8     4  format version (uint32, little-endian), SHARD_VERSION
        12     4  bytes per id (uint32): 2 for uint16 ids, 4 for uint32
        16     8  number of ids (uint64)
        24     4  CRC-32 of the ids' bytes (uint32)
        28    36  zeros (room for later fields)
        64     -  the ids, little-endian

The header is written last (a placeholder first, then the real one once every id is on disk), and
the file is renamed from a temporary name only after that, so a file under a shard's name always
holds its whole header and ids; a prepare killed mid-shard leaves only a `.tmp-` file.

Opening a shard checks what is cheap (magic, version, size against the count); the checksum,
which reads every id, is checked by `verify` (`prepare.py --verify`), not at every start.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minitx.errors import UserError
from minitx.files.atomic import AtomicFile

MAGIC = b"MINITXTK"
SHARD_VERSION = 1
HEADER = struct.Struct("<8sIIQI36x")  # magic, version, itemsize, count, crc32; 64 bytes
assert HEADER.size == 64


class ShardError(ValueError):
    """A shard file that is not what its header or its manifest says."""


class DamagedShard(UserError):
    """A shard found damaged by the batch that reads it (ids past the vocabulary): a training or
    evaluation run stops with one line naming the shard and `prepare.py --verify`."""


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned type that holds every id: half the disk and page cache of int32."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


@dataclass(frozen=True)
class ShardHeader:
    itemsize: int
    count: int
    crc32: int

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint16) if self.itemsize == 2 else np.dtype(np.uint32)


def read_header(path: Path) -> ShardHeader:
    """The header of `path`, checked against the file's size; ShardError says what is wrong."""
    try:
        with open(path, "rb") as file:
            raw = file.read(HEADER.size)
            size = os.fstat(file.fileno()).st_size
    except FileNotFoundError:
        raise ShardError("it is missing") from None
    if len(raw) < HEADER.size:
        raise ShardError(f"it has {size} bytes, fewer than its {HEADER.size}-byte header")
    magic, version, itemsize, count, crc = HEADER.unpack(raw)
    if magic != MAGIC:
        raise ShardError("it is not a minitx token shard (wrong magic bytes)")
    if version != SHARD_VERSION:
        raise ShardError(f"it has format version {version}; this minitx reads version {SHARD_VERSION}")
    if itemsize not in (2, 4):
        raise ShardError(f"its header gives {itemsize} bytes per id; expected 2 or 4")
    if size != HEADER.size + count * itemsize:
        raise ShardError(f"it has {size} bytes where {count} ids take {HEADER.size + count * itemsize}")
    return ShardHeader(itemsize, count, crc)


class ShardWriter:
    """Appends ids to a new shard; `finish()` writes the header and renames it into place, `abort()`
    removes the temporary file."""

    def __init__(self, path: Path, dtype: np.dtype) -> None:
        self.path, self.dtype = Path(path), np.dtype(dtype)
        # Not .bin: a temporary must not look like a shard to the globs that find shards.
        self.atomic = AtomicFile(self.path, suffix=".shard")
        self.file = self.atomic.file
        self.file.write(bytes(HEADER.size))  # a placeholder; the real header goes in last
        self.count = self.crc = 0

    def write(self, ids: np.ndarray) -> None:
        data = np.ascontiguousarray(ids, dtype=self.dtype.newbyteorder("<"))
        view = memoryview(data).cast("B")
        self.crc = zlib.crc32(view, self.crc)
        self.file.write(view)
        self.count += data.size

    def finish(self) -> ShardHeader:
        header = ShardHeader(self.dtype.itemsize, self.count, self.crc)
        self.file.seek(0)
        self.file.write(HEADER.pack(MAGIC, SHARD_VERSION, header.itemsize, header.count, header.crc32))
        self.atomic.commit()
        return header

    def abort(self) -> None:
        """Remove the temporary file: nothing half-written is ever left under the shard's name (or at all)."""
        self.atomic.discard()


def verify(path: Path, vocab_size: int | None = None) -> ShardHeader:
    """Read every id of the shard: its checksum, and (given vocab_size) that every id fits it."""
    header = read_header(path)
    crc, largest = 0, -1
    with open(path, "rb") as file:
        file.seek(HEADER.size)
        while block := file.read(1 << 24):
            crc = zlib.crc32(block, crc)
            if vocab_size is not None:
                largest = max(largest, int(np.frombuffer(block, dtype=header.dtype.newbyteorder("<")).max()))
    if crc != header.crc32:
        raise ShardError("its checksum does not match: the ids were changed after they were written")
    if vocab_size is not None and largest >= vocab_size:
        raise ShardError(f"it holds id {largest}, outside the vocabulary of {vocab_size}")
    return header


# What a page fault may map besides its page: the kernel's fault-around (64 KB), or a whole large
# folio of the page cache (measured up to 1.8 MB for ten windows with a 128 KB margin).
FAULT_AROUND = 1 << 21
# An array of ids at most this large keeps its pages mapped: the resident set grows by at most
# this much, and a batch does not pay for unmapping 4 MB around each window and faulting it in
# again (on Shakespeare's 8.5 MB, 80 of a batch's 100 us of CPU time, most of it in the kernel).
KEEP_MAPPED_BYTES = 32 << 20


class TokenArray:
    """Several shards read as one array of ids, through memory maps.

    `window(start, n)` copies ids start..start+n out (a window may span two shards). Pages a
    long-lived map has touched stay in the process's resident set (and its PSS) until unmapped,
    so that a run over a 100 GB corpus would grow to its size (nanoGPT's issue 287; measured here:
    about 50 KB per random window, with fault-around). Whatever is read (a window, or evaluation's
    positions) has its pages unmapped once copied (MADV_DONTNEED: the next read maps them again
    from the page cache, about 16 us a window), so memory stays flat; an array of at most
    KEEP_MAPPED_BYTES keeps its pages, which cost no more than its size.
    """

    def __init__(
        self,
        paths: Sequence[Path],
        vocab_size: int | None = None,
        headers: Sequence[ShardHeader] | None = None,
    ) -> None:
        self.paths = [Path(p) for p in paths]
        self.vocab_size = vocab_size  # given: every window is checked against it (one max per window)
        # `headers`: the shards' headers, when the caller has just read them (the manifest check).
        self.headers = [read_header(p) for p in self.paths] if headers is None else list(headers)
        dtypes = {h.dtype for h in self.headers}
        if len(dtypes) > 1:
            raise ShardError(f"shards of mixed id types {sorted(d.name for d in dtypes)}")
        self.dtype = next(iter(dtypes)) if dtypes else np.dtype(np.uint16)
        self.ends = np.cumsum([h.count for h in self.headers], dtype=np.int64)
        self.keeps_pages = len(self) * self.dtype.itemsize <= KEEP_MAPPED_BYTES
        self._maps: list[tuple[mmap.mmap, np.ndarray] | None] = [None] * len(self.paths)

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def _ids(self, shard: int) -> np.ndarray:
        opened = self._maps[shard]
        if opened is None:
            with open(self.paths[shard], "rb") as file:
                handle = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            if hasattr(mmap, "MADV_RANDOM"):  # random windows: no read-ahead from disk around each
                handle.madvise(mmap.MADV_RANDOM)
            dtype, count = self.dtype.newbyteorder("<"), self.headers[shard].count
            ids = np.frombuffer(handle, dtype=dtype, count=count, offset=HEADER.size)
            opened = self._maps[shard] = (handle, ids)
        return opened[1]

    def shard_of(self, position: int) -> int:
        return int(np.searchsorted(self.ends, position, side="right"))

    def window(self, start: int, length: int) -> np.ndarray:
        """Ids start .. start + length - 1, as a new int64 array."""
        out = np.empty(length, dtype=np.int64)
        filled = 0
        while filled < length:
            position = start + filled
            shard = self.shard_of(position)
            if shard >= len(self.paths):
                raise IndexError(f"window {start}+{length} runs past the {len(self)} ids")
            first = position - (int(self.ends[shard - 1]) if shard else 0)
            take = min(length - filled, self.headers[shard].count - first)
            piece = self._ids(shard)[first : first + take]
            if self.vocab_size is not None and take and int(piece.max()) >= self.vocab_size:
                raise DamagedShard(
                    f"{self.paths[shard]}: holds id {int(piece.max())}, outside the vocabulary of "
                    f"{self.vocab_size}; the shard was changed after it was prepared: run prepare.py --verify"
                )
            out[filled : filled + take] = piece
            self._drop(shard, first, take)
            filled += take
        return out

    def windows(self, starts: Sequence[int] | np.ndarray, length: int) -> np.ndarray:
        """`window(start, length)` of every start, the rows of one (len(starts), length) int64
        array: a training batch. The windows that lie inside one shard are read with one index
        per shard (12 windows cost about what one `window` call does: 16 us against 260 us, CPU
        time), checked against the vocabulary with one max, and have their pages dropped each as
        `window` drops them; a window across a shard's end (or outside the ids) goes through
        `window`, which reads it piece by piece or raises."""
        starts = np.asarray(starts, dtype=np.int64).reshape(-1)
        out = np.empty((len(starts), length), dtype=np.int64)
        if not len(starts):
            return out
        shards = np.searchsorted(self.ends, starts, side="right")
        firsts = np.concatenate(([0], self.ends[:-1]))  # each shard's first position
        span = np.arange(length)
        for shard in np.unique(shards):
            rows = np.flatnonzero(shards == shard)
            if shard >= len(self.paths):
                inside = np.zeros(len(rows), dtype=bool)
            else:
                local = starts[rows] - firsts[shard]
                inside = (local >= 0) & (local + length <= self.headers[shard].count)
            for row in rows[~inside]:
                out[row] = self.window(int(starts[row]), length)
            if not inside.any():
                continue
            rows, local = rows[inside], local[inside]
            block = self._ids(int(shard))[local[:, None] + span]
            if self.vocab_size is not None and length and int(block.max()) >= self.vocab_size:
                worst = rows[int(block.max(axis=1).argmax())]
                self.window(int(starts[worst]), length)  # raises, naming the shard
            out[rows] = block
            for first in local.tolist():
                self._drop(int(shard), first, length)
        return out

    def __getitem__(self, index) -> np.ndarray:
        """Ids at an int, a slice (step 1) or an array of positions, as int64 (evaluation's windows)."""
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise IndexError("TokenArray slices take step 1")
            return self.window(start, max(0, stop - start))
        if isinstance(index, int | np.integer):
            position = int(index) + (len(self) if index < 0 else 0)
            return self.window(position, 1)[0]
        positions = np.asarray(index, dtype=np.int64)
        flat = positions.ravel()
        out = np.empty(flat.size, dtype=np.int64)
        shard_of = np.searchsorted(self.ends, flat, side="right")
        if flat.size and (flat.min() < 0 or flat.max() >= len(self)):
            raise IndexError(f"positions outside the {len(self)} ids")
        for shard in np.unique(shard_of):
            chosen = shard_of == shard
            local = flat[chosen] - (int(self.ends[shard - 1]) if shard else 0)
            out[chosen] = self._ids(int(shard))[local]
            self._drop(int(shard), int(local.min()), int(local.max() - local.min()) + 1)
        if self.vocab_size is not None and out.size and int(out.max()) >= self.vocab_size:
            self.window(int(flat[out.argmax()]), 1)  # raises the error that names the shard
        return out.reshape(positions.shape)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        ids = self.window(0, len(self))
        return ids if dtype is None else ids.astype(dtype)

    def _drop(self, shard: int, first: int, count: int) -> None:
        """Unmap the pages ids first .. first + count - 1 of a shard were read from, and what a fault
        maps around them (FAULT_AROUND); nothing in an array that keeps its pages."""
        if self.keeps_pages or not hasattr(mmap, "MADV_DONTNEED"):
            return
        handle = self._maps[shard][0]
        begin = HEADER.size + first * self.dtype.itemsize
        low = max(0, (begin - FAULT_AROUND) // mmap.PAGESIZE * mmap.PAGESIZE)
        high = min(len(handle), begin + count * self.dtype.itemsize + FAULT_AROUND)
        if high > low:
            handle.madvise(mmap.MADV_DONTNEED, low, high - low)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_maps"] = [None] * len(self.paths)  # a worker process maps the files itself
        return state
