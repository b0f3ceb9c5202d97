"""Stage 2, the tokenizer and the ids: fitting the tokenizer (char alphabet, BPE on a sample) and
encoding batches of pieces on `num_proc` threads, in order."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from minitx.data.shards import token_dtype
from minitx.data.streams import Piece
from minitx.data.tokenizer import CharTokenizer, HFTokenizer, Tokenizer, build_tokenizer, train_bpe
from minitx.errors import UserError

from . import settings as tuning
from .settings import DataSettings
from .source import Source, _replaced, decode

# -------------------------------------------------------------------------------- the tokenizer


def _fit_tokenizer(settings: DataSettings, source: Source, log) -> Tokenizer:
    kind = settings.tokenizer
    if kind == "char":
        return CharTokenizer(_alphabet(settings, source))
    if kind == "bpe":
        _set_threads(settings.threads())
        return train_bpe(_bpe_sample(settings, source), settings.bpe_vocab_size)
    return build_tokenizer(kind, "", settings.bpe_vocab_size)


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
    pieces = _pieces(source, [0, 0], settings, tuning.BATCH_BYTES)
    for found in _ordered_map(characters, _batches(pieces, tuning.BATCH_BYTES), settings.threads()):
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
            for piece in segment.pieces(0, 0, settings.val_fraction, tuning.PIECE_BYTES):
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
        window = tuning.SAMPLE_WINDOW_BYTES
        count = max(1, budget // window)
        for i in range(count):
            lo = segment.text.cut_at_or_after(segment.start + i * size // count)
            hi = segment.text.cut_at_or_after(min(segment.end, lo + window))
            for end, data in segment.text.pieces(lo, min(hi, segment.end)):
                yield decode(Piece("train", data, [0, end], origin=segment.text), settings.decode_errors)
        return


# -------------------------------------------------------------------------------- encoding


def _pieces(source: Source, position: list[int], settings: DataSettings, piece_bytes: int) -> Iterator[Piece]:
    first, offset = position
    for index, segment in enumerate(source.segments[first:], start=first):
        yield from segment.pieces(index, offset if index == first else 0, settings.val_fraction, piece_bytes)


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
    eos, char = tokenizer.eos_id, isinstance(tokenizer, CharTokenizer)
    newline = tokenizer.encode("\n") if char and "\n" in tokenizer.chars else None
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
            if char:  # one id per character: no decoding to count them
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
