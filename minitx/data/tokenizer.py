"""Tokenizers behind one small interface.

Every tokenizer can describe itself as plain data (`to_dict`: str/int/list/dict only) and be
rebuilt from it (`tokenizer_from_dict`), so a checkpoint carries its tokenizer and loads with
`torch.load(weights_only=True)`; generation needs nothing but the checkpoint.

Kinds:
  "char"          one token per character of the training text; no end-of-text token
  "bpe"           byte-level BPE trained on the training text with `tokenizers`
  a file path     an existing `tokenizer.json` (any model the `tokenizers` library can load)
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import Any, NoReturn

import numpy as np

from minitx.data.streams import next_cut
from minitx.errors import UserError, require

EOS_TOKEN = "<|endoftext|>"
# Tokens that mean "end of text" in common tokenizer.json files, in order of preference.
EOS_CANDIDATES = (EOS_TOKEN, "<|end_of_text|>", "<|eos|>", "</s>", "<eos>")


class Tokenizer(ABC):
    """Text <-> token ids."""

    vocab_size: int
    eos_id: int | None

    @abstractmethod
    def encode(self, text: str) -> list[int]: ...

    @abstractmethod
    def decode(self, ids: list[int]) -> str: ...

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """Everything needed to rebuild this tokenizer, as JSON-serialisable plain data."""

    def encode_corpus(self, text: str) -> np.ndarray:
        """Encode a whole corpus to a 1-D int64 array; subclasses make this fast."""
        return np.asarray(self.encode(text), dtype=np.int64)

    def fingerprint(self) -> str:
        """A stable short hash of `to_dict()`: equal fingerprints mean identical tokenizers."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=True)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


class CharTokenizer(Tokenizer):
    """One id per distinct character; ids follow the sorted order of the characters."""

    def __init__(self, chars: str) -> None:
        if not chars:
            raise UserError("data.tokenizer=char: the training text is empty; give it some text")
        self.chars = "".join(sorted(set(chars)))
        self.vocab_size = len(self.chars)
        self.eos_id = None
        self._id_of = {ch: i for i, ch in enumerate(self.chars)}
        # A table from code point to id (the largest value means unknown): one lookup per character.
        dtype = np.uint16 if self.vocab_size < 2**16 else np.uint32
        self._unknown = np.iinfo(dtype).max
        self._lut = np.full(max(0x100, ord(self.chars[-1]) + 1), self._unknown, dtype=dtype)
        self._lut[[ord(ch) for ch in self.chars]] = np.arange(self.vocab_size, dtype=dtype)
        table = [0x80] * 0x100  # bytes from 0x80: a placeholder, replaced or dropped in encode_utf8
        table[:0x80] = [int(i) if i != self._unknown else 0xFF for i in self._lut[:0x80]]
        self._ascii_table = bytes(table)

    def _raise_unknown(self, text: str) -> NoReturn:
        unknown = sorted(set(text) - set(self._id_of))
        shown = ", ".join(repr(ch) for ch in unknown[:20]) + (", ..." if len(unknown) > 20 else "")
        raise UserError(
            f"text contains characters the tokenizer does not know: {shown}; "
            "a character-level tokenizer knows only the characters of its training text"
        )

    def encode(self, text: str) -> list[int]:
        try:
            return [self._id_of[ch] for ch in text]
        except KeyError:
            self._raise_unknown(text)

    def encode_corpus(self, text: str) -> np.ndarray:
        return self.encode_utf8(text.encode("utf-8")).astype(np.int64)

    def encode_utf8(self, data: bytes | str) -> np.ndarray:
        """Ids of UTF-8 bytes (or a str) by table lookup, in the smallest unsigned type that holds them.

        Bytes below 0x80 are ASCII characters and index the table directly (hundreds of MB/s per
        core, and numpy lets other threads run meanwhile); only the runs of other bytes are
        decoded, each multi-byte character's id goes where its first byte was, and the rest of
        its bytes are dropped. Invalid UTF-8 raises UnicodeDecodeError.
        """
        if isinstance(data, str):
            return self._lookup(np.frombuffer(data.encode("utf-32-le"), dtype=np.uint32), data)
        # ASCII characters sort first, so their ids are below 0x80 and fit a byte: bytes.translate
        # maps them at memory speed (0xFF marks a character the tokenizer does not know).
        translated = data.translate(self._ascii_table)
        if b"\xff" in translated:
            self._raise_unknown(data.decode("utf-8", "replace"))
        ids = np.frombuffer(translated, dtype=np.uint8).astype(self._lut.dtype)
        if data.isascii():
            return ids
        raw = np.frombuffer(data, dtype=np.uint8)
        other = np.flatnonzero(raw >= 0x80)
        for run in np.split(other, np.flatnonzero(np.diff(other) != 1) + 1):
            first, last = int(run[0]), int(run[-1]) + 1
            text = data[first:last].decode("utf-8")  # a run is whole characters, or invalid
            leads = first + np.flatnonzero((raw[first:last] & 0xC0) != 0x80)
            ids[leads] = self._lookup(np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32), text)
        # Drop the other bytes of each multi-byte character: keep the slices between them.
        dropped = other[(raw[other] & 0xC0) == 0x80]
        bounds = np.concatenate([[0], dropped + 1]), np.concatenate([dropped, [len(ids)]])
        return np.concatenate([ids[a:b] for a, b in zip(*bounds, strict=True)])

    def _lookup(self, codepoints: np.ndarray, text: str) -> np.ndarray:
        if codepoints.size and int(codepoints.max()) >= len(self._lut):
            self._raise_unknown(text)
        ids = self._lut[codepoints]
        if ids.size and ids.max() == self._unknown:
            self._raise_unknown(text)
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] for i in ids)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "char", "chars": self.chars}


_CHUNK_BYTES = 1 << 16  # read at each call of _chunks, not bound as a default: a test makes chunks tiny


def _chunks(text: str) -> Iterator[str]:
    """`text` in pieces of about _CHUNK_BYTES of UTF-8, cut where the streams cut a text file
    (streams.next_cut), so that encoding piece by piece gives exactly the ids of the whole."""
    data = text.encode("utf-8")
    start = 0
    while start < len(data):
        end = next_cut(data, start + _CHUNK_BYTES, final=True)  # after a newline: a character boundary
        yield data[start:end].decode("utf-8")
        start = end


class HFTokenizer(Tokenizer):
    """A `tokenizers.Tokenizer`: the trained byte-level BPE, or one read from tokenizer.json."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        ids = (tokenizer.token_to_id(token) for token in EOS_CANDIDATES)
        self.eos_id = next((token_id for token_id in ids if token_id is not None), None)

    def encode(self, text: str) -> list[int]:
        # No special tokens: a tokenizer.json may add BOS/CLS per call, which would land in
        # the middle of the training data when the corpus is encoded in chunks.
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_corpus(self, text: str) -> np.ndarray:
        ids = [np.asarray(piece, dtype=np.int64) for piece in self.encode_pieces(list(_chunks(text)))]
        return np.concatenate(ids or [np.zeros(0, dtype=np.int64)])

    def encode_pieces(self, pieces: list[str]) -> list[list[int]]:
        """Ids of each piece, in one call that spreads the pieces over the library's threads."""
        # encode_batch_fast (tokenizers 0.21+) skips the character offsets: 1.5x faster here.
        encode = getattr(self._tokenizer, "encode_batch_fast", self._tokenizer.encode_batch)
        return [e.ids for e in encode(pieces, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "tokenizers", "json": self._tokenizer.to_str()}


def train_bpe(text: str | Iterable[str], vocab_size: int) -> HFTokenizer:
    """Byte-level BPE with `<|endoftext|>` as its end-of-text token, trained on `text` (a str, or
    pieces of text cut where the tokenizer's splits do not change, as the streams cut them)."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    byte_alphabet = pre_tokenizers.ByteLevel.alphabet()
    smallest = len(byte_alphabet) + 1  # every byte plus the end-of-text token
    if vocab_size < smallest:
        raise UserError(
            f"data.bpe_vocab_size: byte-level BPE needs at least {smallest} tokens "
            f"(256 bytes + {EOS_TOKEN}), got {vocab_size}; raise it (e.g. 512)"
        )
    pieces = _chunks(text) if isinstance(text, str) else iter(text)
    first = next(pieces, "")
    if not first:
        raise UserError("data.tokenizer=bpe: the training text is empty; give it some text")
    tokenizer = RawTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=byte_alphabet,  # so that any text, even unseen bytes, can be encoded
        show_progress=False,
    )
    tokenizer.train_from_iterator(itertools.chain([first], pieces), trainer)
    return HFTokenizer(tokenizer)


def load_tokenizer_file(path: str) -> HFTokenizer:
    from tokenizers import Tokenizer as RawTokenizer

    expanded = os.path.expanduser(path)
    if not os.path.isfile(expanded):
        raise UserError(
            f"data.tokenizer: {path!r} is neither 'char', 'bpe' nor an existing tokenizer.json file"
        )
    try:
        tokenizer = RawTokenizer.from_file(expanded)
    except Exception as err:  # the Rust side raises a bare Exception on a malformed file
        raise UserError(
            f"data.tokenizer: {path!r} is not a valid tokenizer.json ({' '.join(str(err).split())})"
        ) from None
    return HFTokenizer(tokenizer)


def build_tokenizer(kind: str, train_text: str, vocab_size: int | None = None) -> Tokenizer:
    """A tokenizer of `kind` ("char", "bpe" or the path of a tokenizer.json), fitted to `train_text`
    if it learns."""
    if kind == "char":
        return CharTokenizer(train_text)
    if kind == "bpe":
        require(vocab_size is not None, "data.bpe_vocab_size: required for data.tokenizer=bpe, e.g. 512")
        return train_bpe(train_text, vocab_size)
    if kind.endswith(".json"):
        return load_tokenizer_file(kind)
    raise UserError(
        f"data.tokenizer: unknown tokenizer {kind!r}; use 'char', 'bpe' or a path to a tokenizer.json"
    )


def tokenizer_from_dict(data: dict[str, Any]) -> Tokenizer:
    """Rebuild a tokenizer from `Tokenizer.to_dict()` output (e.g. read from a checkpoint)."""
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind == "char":
        return CharTokenizer(data["chars"])
    if kind == "tokenizers":
        from tokenizers import Tokenizer as RawTokenizer

        return HFTokenizer(RawTokenizer.from_str(data["json"]))
    raise UserError(f"tokenizer: unknown saved tokenizer kind {kind!r}; expected 'char' or 'tokenizers'")
