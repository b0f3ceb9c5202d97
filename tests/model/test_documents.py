"""Attention inside its document: for x = [doc A][doc B], each starting with the document token,
the outputs at B's positions equal those of [doc B] alone, for every kind and a mix of kinds, in
one pass and decoding through the cache (minitx/documents.py).

Rows of a batch split at different places, and a window may begin inside a document (before its
first document token). Sizes are awkward (67 tokens; pieces of 1, 5, 29 and 37) and each test
draws a fresh seed (see conftest.py). Every check is also run with documents off, where the same
inputs must leak (so the comparison can see a leak at all).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_model import KIND_CASES, VOCAB, build, case_config

from minitx import AttentionConfig, ModelConfig, Transformer, import_kind_modules
from minitx.documents import Documents
from minitx.errors import UserError

pytestmark = pytest.mark.usefixtures("seed", "one_thread")

DOC = 0  # the document token in these tests
# Local attention's global tokens are the sequence's first: refused with documents (tested below).
CASES = [name for name, case in KIND_CASES.items() if "n_global" not in str(case)]
CASES += ["learned-positions", "mixed-local-sinks-gated-gqa-no-global", "custom-kind-mixed"]
# A kind written outside minitx (examples/custom_attention.py) gets documents with no code of its own.
EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "custom_attention.py")


def config_for(name: str, document_token: int | None = DOC) -> ModelConfig:
    if name == "learned-positions":
        return ModelConfig(
            **dict(case_config("gqa").__dict__, positions="learned", document_token=document_token)
        )
    if name == "custom-kind-mixed":
        import_kind_modules([EXAMPLE])  # a config only names the file; importing it is the caller's
        attention = AttentionConfig(
            layers=["ssmax", "mta"], kind_modules=[EXAMPLE], options={"mta": {"query_chunk": 5}}
        )
        return ModelConfig(
            **dict(case_config("mha").__dict__, attention=attention, document_token=document_token)
        )
    if name == "mixed-local-sinks-gated-gqa-no-global":
        config = case_config("mixed-local-sinks-gated-gqa")
        config.attention = config.attention.with_options("local", n_global=0)
    else:
        config = case_config(name)
    return ModelConfig(**dict(config.__dict__, document_token=document_token))


def document(length: int, starts: bool = True) -> torch.Tensor:
    """Random tokens other than the document token, which starts the document (if `starts`)."""
    doc = torch.randint(1, VOCAB, (length,))
    if starts:
        doc[0] = DOC
    return doc


def rows_of_documents(layouts) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
    """A batch whose rows are the documents of `layouts` joined; a layout's first piece may be the
    tail of a document that began before the window (no document token)."""
    rows = [[document(n, starts=i > 0 or first) for i, n in enumerate(lengths)] for lengths, first in layouts]
    return torch.stack([torch.cat(docs) for docs in rows]), rows


LAYOUTS = [([37, 30], True), ([5, 1, 61], False), ([67], True)]


def each_alone(model: Transformer, rows) -> list[torch.Tensor]:
    """Each row's logits, computed document by document, each alone."""
    with torch.no_grad():
        return [torch.cat([model(doc[None])[0] for doc in docs]) for docs in rows]


@pytest.mark.parametrize("name", CASES)
def test_outputs_in_a_document_equal_the_document_alone(name):
    model = build(config_for(name))
    idx, rows = rows_of_documents(LAYOUTS)
    with torch.no_grad():
        packed = model(idx)
    for row, alone in enumerate(each_alone(model, rows)):
        assert (packed[row] - alone).abs().max() < 1e-5, row
    if name == "local-window1":
        return  # a window of one token never reaches another document
    # The same inputs without documents: attention runs across the starts, and the outputs move.
    model.config.document_token = None
    with torch.no_grad():
        leaky = model(idx)
    assert (leaky[0] - packed[0]).abs().max() > 1e-4


@pytest.mark.parametrize("name", CASES)
def test_cached_decoding_starts_each_document_afresh(name):
    model = build(config_for(name))
    idx, rows = rows_of_documents(LAYOUTS[:2])
    alone = each_alone(model, rows)
    prompt = 20  # a prefill through the fast path, then one token per step through the cache
    with torch.no_grad():
        cache = model.new_cache(batch=2)
        steps = [model(idx[:, :prompt], cache=cache)]
        steps += [model(idx[:, t : t + 1], cache=cache) for t in range(prompt, idx.shape[1])]
    cached = torch.cat(steps, dim=1)
    for row in range(2):
        assert (cached[row] - alone[row]).abs().max() < 1e-4, row


def test_mta_decodes_documents_one_token_per_call():
    # MTA's cached path takes one window of keys per row: several new tokens, each perhaps of a
    # document of its own, are refused rather than computed against the wrong window.
    model = build(config_for("mta-both"))
    idx, _ = rows_of_documents(LAYOUTS[:2])
    with torch.no_grad():
        cache = model.new_cache(batch=2)
        model(idx[:, :20], cache=cache)
        with pytest.raises(ValueError, match="one token per call"):
            model(idx[:, 20:22], cache=cache)


def test_documents_mark_starts_and_positions():
    idx = torch.tensor([[5, 0, 7, 7, 0, 3], [0, 1, 2, 3, 4, 5]])
    docs = Documents.of(idx, token=0)
    assert docs.starts.tolist() == [[0, 1, 1, 1, 4, 4], [0, 0, 0, 0, 0, 0]]
    assert docs.positions.tolist() == [[0, 0, 1, 2, 0, 1], [0, 1, 2, 3, 4, 5]]
    assert docs.pieces() == [[(0, 1), (1, 4), (4, 6)], [(0, 6)]]
    # Decoding: the running document began at 9 (row 0) and 2 (row 1); row 1 starts a new one at 11.
    later = Documents.of(torch.tensor([[4, 4], [4, 0]]), 0, offset=10, previous=torch.tensor([9, 2]))
    assert later.starts.tolist() == [[9, 9], [2, 11]]
    mask = docs.mask()[0, 0]
    assert mask[5].tolist() == [False, False, False, False, True, True]
    assert docs.mask(leading=1)[0, 0, 6].tolist() == [True, False, False, False, False, True, True]
    assert docs.mask(leading=1)[0, 0, 0].tolist() == [True] + [False] * 6


@pytest.mark.parametrize("token", [-1, VOCAB, True, 2.0])
def test_document_token_outside_the_vocabulary_is_refused(token):
    with pytest.raises(UserError, match="document_token"):
        config_for("mha", document_token=token)


def test_global_tokens_with_documents_are_refused():
    with pytest.raises(UserError, match="attention.options.local.n_global"):
        config_for("local-global-gqa")


@pytest.mark.parametrize("leading", [0, 1])
def test_attention_in_query_blocks_equals_the_dense_mask(leading):
    # Past QUERY_BLOCK queries, masked_attention works block by block; at 600 tokens (not a multiple
    # of the block) with documents of every length, it must equal one call under the dense mask.
    from minitx import functional
    from minitx.documents import QUERY_BLOCK, masked_attention

    T = 600
    idx = torch.randint(1, VOCAB, (3, T))
    idx[0, [5, 300, 301, 599]] = DOC  # a one-token document, and one at the very end
    idx[1, torch.randint(0, T, (12,))] = DOC  # short documents
    idx[1, 400] = idx[2, 500] = DOC  # so that the last block's keys start past the leading token
    docs = Documents.of(idx, DOC)
    q, k, v = (torch.randn(3, 2, leading + T, 8, dtype=torch.float64) for _ in range(3))

    def attend(q, k, v, mask):
        return functional.attention(q, k, v, causal=False, mask=mask)

    calls = []
    blocked = masked_attention(lambda *a: calls.append(a[1].shape[2]) or attend(*a), q, k, v, docs, leading)
    dense = attend(q, k, v, docs.mask(leading))
    assert len(calls) == -(-(leading + T) // QUERY_BLOCK) and calls[-1] < 400  # the last block skips keys
    assert (blocked - dense).abs().max() < 1e-12


LONG_CASES = {
    "mha": dict(kind="mha"),
    "gqa-sinks-gate": dict(kind="gqa", n_kv_head=2, options={"gqa": {"sinks": True, "gate": "head"}}),
    "local-wide-sinks": dict(kind="local", options={"local": {"window": 400, "sinks": True}}),
    "mla": KIND_CASES["mla"],
    "diff": KIND_CASES["diff"],
}


@pytest.mark.parametrize("name", list(LONG_CASES))
def test_long_windows_in_blocks_equal_each_document_alone(name):
    model = build(
        ModelConfig(
            vocab_size=VOCAB,
            block_size=320,
            n_layer=1,
            n_head=4,
            d_model=32,
            attention=LONG_CASES[name],
            document_token=DOC,
        )
    )
    # The second block of queries (256 on) needs no key before 150.
    idx, rows = rows_of_documents([([200, 3, 97], True), ([150, 150], False)])
    with torch.no_grad():
        packed = model(idx)
    for row, alone in enumerate(each_alone(model, rows)):
        assert (packed[row] - alone).abs().max() < 1e-5, row


@pytest.mark.slow  # compiles flex attention (about 15-30 s on the CPU, forward only there)
@pytest.mark.parametrize(
    "name", ["mha", "gqa", "local", "mha-sinks-qknorm-gate", "mixed-local-sinks-gated-gqa-no-global"]
)
def test_flex_block_masks_equal_each_document_alone(name, monkeypatch):
    # The CUDA path of mha/mqa/gqa and local with documents, taken here on the CPU.
    from minitx.attention.grouped import GroupedQueryAttention
    from minitx.attention.local import LocalAttention

    calls = []
    for cls in (GroupedQueryAttention, LocalAttention):
        monkeypatch.setattr(cls, "use_flex", lambda self, q: calls.append(1) or True)
    model = build(config_for(name))
    idx, rows = rows_of_documents(LAYOUTS)
    with torch.no_grad():
        packed = model(idx)
    assert calls
    for row, alone in enumerate(each_alone(model, rows)):
        assert (packed[row] - alone).abs().max() < 1e-5, row
