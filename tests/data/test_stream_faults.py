"""generate's TextStream prints exactly what decoding the whole sequence each time printed (the
earlier implementation, kept here as the oracle), for char and byte-level BPE tokenizers, on
random token sequences of awkward lengths (whole windows, one token, partial characters)."""

from __future__ import annotations

import io
import random

import pytest
from helpers import bpe_tokenizer

from minitx.data.tokenizer import CharTokenizer
from minitx.generation.command import TextStream


class WholeTextStream:
    """The oracle: decodes the whole sequence for every token (quadratic, but plainly right)."""

    def __init__(self, tokenizer, prompt_ids, out):
        self.tokenizer, self.ids, self.n_prompt, self.out = tokenizer, list(prompt_ids), len(prompt_ids), out
        self.base, self.printed = tokenizer.decode(self.ids), ""

    def add(self, token_id):
        self.ids.append(token_id)
        self._show(final=False)

    def finish(self):
        self._show(final=True)
        self.out.write("\n")

    def _show(self, final):
        text = self.tokenizer.decode(self.ids)
        continuation = (
            text[len(self.base) :]
            if text.startswith(self.base)
            else self.tokenizer.decode(self.ids[self.n_prompt :])
        )
        if not final:
            continuation = continuation.rstrip("\ufffd")
        if continuation.startswith(self.printed) and len(continuation) > len(self.printed):
            self.out.write(continuation[len(self.printed) :])
            self.printed = continuation


def writes(stream_class, tokenizer, ids, n_prompt):
    out = io.StringIO()
    chunks = []
    out.write = lambda text: chunks.append(text)  # record each write: the stream, not just its end
    stream = stream_class(tokenizer, ids[:n_prompt], out)
    for token in ids[n_prompt:]:
        stream.add(token)
    stream.finish()
    return chunks


@pytest.mark.parametrize("kind", ["char", "bpe"])
@pytest.mark.parametrize(
    "length", [1, 2, TextStream.WINDOW, TextStream.WINDOW + 1, 3 * TextStream.WINDOW + 5, 500]
)
def test_the_stream_prints_what_decoding_the_whole_text_prints(kind, length, seed):
    tokenizer = bpe_tokenizer() if kind == "bpe" else CharTokenizer("abc déf\n✓")
    rng = random.Random(seed + length)
    ids = [rng.randrange(tokenizer.vocab_size) for _ in range(length + 3)]
    if tokenizer.eos_id is not None:
        ids = [i for i in ids if i != tokenizer.eos_id] or [0]
    n_prompt = min(3, len(ids) - 1)
    assert writes(TextStream, tokenizer, ids, n_prompt) == writes(WholeTextStream, tokenizer, ids, n_prompt)
