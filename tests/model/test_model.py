"""The whole model: causality for every attention kind, equivalences between kinds, shapes.

Causality is checked two ways on a tiny model: (1) changing the tokens at positions >= t leaves
the logits before t unchanged; (2) the gradient of the logits at position i with respect to the
input embedding at any j > i is exactly zero. Sizes are awkward on purpose: T = 67 is not a
multiple of local attention's block (64) nor of MTA's query chunk (5). The checker is shown to
have teeth: it flags a local window that peeks one token ahead, an MTA convolution padded
symmetrically along the query axis, and gdn's short convolution centred or its keys one token early.

Each test draws a fresh seed (printed in the captured output of a failure); set MINITX_TEST_SEED
to replay one.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import minitx.rope
from minitx import AttentionConfig, ModelConfig, Transformer, attention, verify
from minitx.attention import gdn, local
from minitx.attention.gdn import GatedDeltaNet
from minitx.attention.mta.layer import MTACache, MultiTokenAttention
from minitx.cache import KVCache
from minitx.rope import RotaryEmbedding, apply_rope
from minitx.verify import perturb_identity_parts

pytestmark = pytest.mark.usefixtures("seed", "one_thread")

VOCAB, BLOCK, T = 32, 96, 67


def tiny(n_layer: int = 2, n_head: int = 4, d_model: int = 32, **att) -> ModelConfig:
    return ModelConfig(
        vocab_size=VOCAB,
        block_size=BLOCK,
        n_layer=n_layer,
        n_head=n_head,
        d_model=d_model,
        attention=AttentionConfig(**att),
    )


def build(config: ModelConfig) -> Transformer:
    """An eval-mode model whose MTA parts (identity at init) are perturbed, so a leak would show."""
    return perturb_identity_parts(Transformer(config).eval())


# -- the causality checker (minitx.verify: shared with benchmarks/gpu.py) ------------------------------


def causality_violation(model: Transformer, T: int = T) -> tuple[float, float]:
    """minitx.verify.causality_violation at this file's awkward length (67: not a multiple of local
    attention's block (64) nor of MTA's query chunk (5))."""
    return verify.causality_violation(model, T)


def assert_causal(model: Transformer, T: int = T) -> None:
    changed, leak = causality_violation(model, T)
    assert changed <= 1e-6, f"logits before t moved by {changed} when tokens at >= t changed"
    assert leak == 0.0, f"gradient {leak} from a future embedding"


KIND_CASES = {
    "mha": dict(kind="mha"),
    "mqa": dict(kind="mqa"),
    "gqa": dict(kind="gqa", n_kv_head=2),
    "local": dict(kind="local", options={"local": {"window": 5}}),
    "local-window1": dict(kind="local", options={"local": {"window": 1}}),
    "local-global-gqa": dict(kind="local", options={"local": {"window": 7, "n_global": 3}}, n_kv_head=2),
    "local-mqa": dict(kind="local", options={"local": {"window": 20}}, n_kv_head=1),
    "mta-pre": dict(kind="mta", options={"mta": {"conv_layers": [0, 1], "query_chunk": 5}}),
    "mta-post": dict(
        kind="mta", options={"mta": {"conv_layers": [0, 1], "query_chunk": 5, "conv_placement": "post"}}
    ),
    "mta-both": dict(
        kind="mta", options={"mta": {"conv_layers": [0, 1], "query_chunk": 5, "conv_placement": "both"}}
    ),
    "mta-mix-none": dict(
        kind="mta", options={"mta": {"conv_layers": [0], "query_chunk": 5, "head_mix": "none"}}
    ),
    "mta-mix-pre": dict(
        kind="mta", options={"mta": {"conv_layers": [0], "query_chunk": 5, "head_mix": "pre"}}
    ),
    "mta-mix-post-group2": dict(
        kind="mta",
        options={"mta": {"conv_layers": [1], "query_chunk": 5, "head_mix": "post", "head_group": 2}},
    ),
    "mta-gqa": dict(kind="mta", options={"mta": {"conv_layers": [0, 1], "query_chunk": 5}}, n_kv_head=2),
    "mta-post-mqa-one-chunk": dict(
        kind="mta", options={"mta": {"conv_layers": [0, 1], "conv_placement": "post"}}, n_kv_head=1
    ),
    "mixed-local-mha": dict(
        layers=["local", "local", "local", "mha"], options={"local": {"window": 5}}, n_layer=4
    ),
    "mha-sinks-qknorm-gate": dict(
        kind="mha", options={"mha": {"sinks": True, "qk_norm": True, "gate": "head"}}
    ),
    "local-sinks-gqa": dict(kind="local", options={"local": {"window": 5, "sinks": True}}, n_kv_head=2),
    "mixed-local-sinks-gated-gqa": dict(
        layers=["local", "gqa"],
        n_kv_head=2,
        options={"local": {"window": 7, "sinks": True, "n_global": 2}, "gqa": {"gate": "elementwise"}},
    ),
    "diff": dict(kind="diff"),
    "diff-gqa": dict(kind="diff", n_kv_head=2),
    "mixed-diff-mha": dict(layers=["diff", "mha"]),
    "mixed-mta-gqa": dict(
        layers=["mta", "gqa"], n_kv_head=2, options={"mta": {"conv_layers": [0], "query_chunk": 5}}
    ),
    "mla": dict(kind="mla", options={"mla": {"kv_lora_rank": 12, "qk_rope_head_dim": 4}}),
    "mixed-mla-q-latent-local": dict(
        layers=["mla", "local"],
        options={
            "mla": {"kv_lora_rank": 12, "qk_rope_head_dim": 4, "q_lora_rank": 10},
            "local": {"window": 5},
        },
    ),
    # Chunks of 16: T = 67 is four full chunks and a partial one.
    "gdn": dict(kind="gdn", options={"gdn": {"chunk_size": 16}}),
    "gdn-grouped-values-deltanet": dict(
        kind="gdn",
        options={"gdn": {"chunk_size": 16, "n_value_head": 8, "decay": False, "allow_neg_eigval": True}},
    ),
    "mixed-gdn-gated-mha": dict(
        layers=["gdn", "gdn", "gdn", "mha"],
        options={"gdn": {"chunk_size": 16}, "mha": {"gate": "head", "qk_norm": True}},
        n_layer=4,
    ),
}


def case_config(name: str) -> ModelConfig:
    att = dict(KIND_CASES[name])
    return tiny(n_layer=att.pop("n_layer", 2), **att)


@pytest.mark.parametrize("name", list(KIND_CASES))
def test_causal(name):
    assert_causal(build(case_config(name)))


@pytest.mark.parametrize("name", list(KIND_CASES))
def test_single_token_and_prefixes_agree_with_full_sequence(name):
    # A prefix run is the causal statement from the other side: it must give the same logits.
    model = build(case_config(name))
    idx = torch.randint(0, VOCAB, (2, T))
    with torch.no_grad():
        full = model(idx)
        for t in (1, 13, 64):
            assert (model(idx[:, :t]) - full[:, :t]).abs().max() < 1e-5, t
    assert_causal(model, T=1)


# -- teeth: the checker flags deliberately broken attention -----------------------------------------


def test_checker_catches_local_window_one_token_into_the_future(monkeypatch):
    real_block_mask = local._block_mask

    def peeking_block_mask(n, C, window, n_global, device):
        mask = real_block_mask(n, C, window, n_global, device).clone()  # (n, 1, C, 2C [+ globals])
        row = torch.arange(C - 1)
        mask[:, :, row, C + row + 1] = True  # query i also sees key i + 1 within its block
        return mask

    monkeypatch.setattr(local, "_block_mask", peeking_block_mask)
    changed, leak = causality_violation(build(case_config("local")))
    assert changed > 1e-3 and leak > 0


class SymmetricQueryPaddingMTA(MultiTokenAttention):
    """The known public bug: the query axis padded on both sides, so rows below (the future) leak."""

    def convolve(self, scores, kernel, visible):
        scores = scores.masked_fill(visible.hidden, 0.0)
        top = (self.c_q - 1) // 2
        rows = scores[:, :, self.c_q - 1 :]  # drop the history rows, pad around the chunk instead
        padded = F.pad(rows, (self.c_k // 2, self.c_k // 2, top, self.c_q - 1 - top))
        return F.conv2d(padded, kernel, groups=self.n_head)

    def one_pass_weights(self, *args, **kwargs):
        return None  # the one C call for convolution and softmax would bypass the planted convolution


@pytest.mark.parametrize("placement", ["pre", "post", "both"])
def test_checker_catches_mta_padded_symmetrically(monkeypatch, placement):
    spec = dataclasses.replace(attention.registry["mta"], module=SymmetricQueryPaddingMTA)
    monkeypatch.setitem(attention.registry, "mta", spec)
    # The plain chunked convolution: the factorised path convolves no score map to plant the bug in.
    model = build(
        tiny(
            kind="mta",
            options={
                "mta": {
                    "conv_layers": [0, 1],
                    "query_chunk": 5,
                    "conv_placement": placement,
                    "backend": "conv",
                }
            },
        )
    )
    assert isinstance(model.blocks[0].attn, SymmetricQueryPaddingMTA)
    changed, leak = causality_violation(model)
    assert changed > 1e-3 and leak > 0


class SymmetricConvolutionGDN(GatedDeltaNet):
    """gdn whose short convolution is centred instead of causal: each token mixes in the inputs of
    the next ones (conv_size // 2 of them) before the recurrence, which itself is causal."""

    def convolve(self, mixed, window, docs, start):
        K = self.conv_size
        padded = F.pad(mixed, (0, 0, K // 2, K - 1 - K // 2)).transpose(1, 2)
        out = F.conv1d(padded, self.conv.weight, groups=self.channels).transpose(1, 2)
        return F.silu(out), padded.transpose(1, 2)[:, -(K - 1) :]


def test_checker_catches_a_gdn_convolution_that_sees_the_next_tokens(monkeypatch):
    spec = dataclasses.replace(attention.registry["gdn"], module=SymmetricConvolutionGDN)
    monkeypatch.setitem(attention.registry, "gdn", spec)
    model = build(case_config("mixed-gdn-gated-mha"))
    assert isinstance(model.blocks[0].attn, SymmetricConvolutionGDN)
    changed, leak = causality_violation(model)
    assert changed > 1e-3 and leak > 0


def test_checker_catches_gdn_keys_one_token_early(monkeypatch):
    """The chunked form fed each token's key one step too early: token t writes k_{t+1}."""
    real = gdn.chunk_gated_delta

    def early_keys(q, k, v, *args, **kwargs):
        return real(q, k.roll(-1, dims=2), v, *args, **kwargs)

    monkeypatch.setattr(gdn.delta_rule, "chunk_gated_delta", early_keys)
    changed, leak = causality_violation(build(case_config("gdn")))
    assert changed > 1e-3 and leak > 0


# -- equivalences between kinds ------------------------------------------------------------------------


def same_logits(a: Transformer, b: Transformer, T: int = T, tol: float = 1e-5) -> None:
    idx = torch.randint(0, VOCAB, (2, T))
    with torch.no_grad():
        diff = (a(idx) - b(idx)).abs().max().item()
    assert diff <= tol, diff


def copy_of(config: ModelConfig, source: Transformer) -> Transformer:
    model = Transformer(config).eval()
    model.load_state_dict(source.state_dict())  # strict: the same parameters, named the same
    return model


@pytest.mark.parametrize("place", ["embed", "attn", "resid"])
def test_each_dropout_acts_at_its_own_place_only(place):
    """Half of the entries dropped at `place`, none elsewhere: the embeddings reach the block with
    zeros (embed), the attention weights reach the values with zeros (attn: the weights' dropout
    the kind is handed), what the block adds to the residual stream has zeros (resid)."""
    config = ModelConfig(
        vocab_size=50,
        block_size=32,
        n_layer=1,
        n_head=2,
        d_model=64,
        mlp="none",
        dropout=0.0,
        **{f"{place}_dropout": 0.5},
    )
    model = Transformer(config).train()
    seen = {}
    block = model.blocks[0]
    block.register_forward_hook(lambda m, args, out: seen.update(x=args[0], out=out))
    block.attn.register_forward_hook(lambda m, args, out: seen.update(p=m.dropout_p))
    idx = torch.randint(0, 50, (4, 32))
    model(idx)
    first = seen["out"]
    model(idx)
    assert not torch.equal(first, seen["out"])  # some dropout acts at every place...
    zeros_in = (seen["x"] == 0).float().mean().item()
    added = seen["out"] - seen["x"]
    zeros_added = (added == 0).float().mean().item()
    assert (0.4 < zeros_in < 0.6) == (place == "embed")
    assert (seen["p"] == 0.5) == (place == "attn")
    assert (0.4 < zeros_added < 0.6) == (place == "resid")  # ...but at this one only
    model.eval()
    model(torch.randint(0, 50, (4, 32)))
    assert seen["p"] == 0.0 and (seen["x"] != 0).all()


def test_gqa_with_all_kv_heads_is_mha():
    mha = Transformer(tiny(kind="mha")).eval()
    same_logits(mha, copy_of(tiny(kind="gqa", n_kv_head=4), mha))


def test_mqa_is_gqa_with_one_kv_head():
    mqa = Transformer(tiny(kind="mqa")).eval()
    same_logits(mqa, copy_of(tiny(kind="gqa", n_kv_head=1), mqa))


@pytest.mark.parametrize("window", [T, T + 40])
def test_local_with_window_covering_the_sequence_is_causal_attention(window):
    mha = Transformer(tiny(kind="mha")).eval()
    same_logits(mha, copy_of(tiny(kind="local", options={"local": {"window": window}}), mha))


def test_chunked_local_with_window_covering_the_sequence_is_causal_attention():
    # The model short-cuts window >= T to SDPA; the chunked path must agree on its own too.
    q, k, v = torch.randn(2, 4, T, 8), torch.randn(2, 2, T, 8), torch.randn(2, 2, T, 8)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert (local.chunked_local(q, k, v, window=T) - expected).abs().max() < 1e-5


@pytest.mark.parametrize("n_kv_head", [4, 2])
def test_untrained_mta_is_plain_attention(n_kv_head):
    # The output norm stays off: RMSNorm and the sigmoid gate are not the identity at init.
    att = dict(
        n_kv_head=n_kv_head, options={"mta": {"conv_layers": [0, 1], "output_norm": False, "query_chunk": 5}}
    )
    plain = Transformer(tiny(kind="gqa", n_kv_head=n_kv_head)).eval()
    mta = Transformer(tiny(kind="mta", **att)).eval()
    result = mta.load_state_dict(plain.state_dict(), strict=False)
    assert not result.unexpected_keys
    assert {key.split(".")[-1] for key in result.missing_keys} == {"kq_conv", "mix_pre", "mix_post"}
    same_logits(plain, mta)


# -- RoPE ------------------------------------------------------------------------------------------------


def rope_reference(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Pair i of each head, (x[i], x[i + D/2]), as the complex number x[i] + 1j x[i + D/2], turned
    by the angle position * base^(-2i/D): the textbook definition, in float64."""
    D = x.shape[-1]
    freqs = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    turn = torch.polar(
        torch.ones(len(positions), D // 2, dtype=torch.float64), positions.double()[:, None] * freqs
    )
    pairs = torch.complex(x[..., : D // 2].double(), x[..., D // 2 :].double()) * turn  # (B, heads, T, D/2)
    return torch.cat([pairs.real, pairs.imag], dim=-1)


@pytest.mark.parametrize(
    "start, length", [(0, 1), (0, 13), (9, 1), (5, 27)]
)  # 5 + 27 > block_size: the table grows
def test_rope_matches_complex_rotation(start, length):
    D = 12
    rope = RotaryEmbedding(D, block_size=16)
    x = torch.randn(2, 3, length, D)
    expected = rope_reference(x, torch.arange(start, start + length))
    assert (apply_rope(x, rope(start, length)).double() - expected).abs().max() < 1e-5
    # Only relative offsets matter: q at m against k at n scores as at m + 7 and n + 7.
    q, k = torch.randn(1, 1, 1, D), torch.randn(1, 1, 1, D)

    def score(m: int, n: int) -> float:
        return (apply_rope(q, rope(m, 1)) * apply_rope(k, rope(n, 1))).sum().item()

    assert score(3, 11) == pytest.approx(score(10, 18), abs=1e-5)
    assert score(11, 3) == pytest.approx(score(18, 10), abs=1e-5)


def test_rope_is_a_leaf_and_a_model_builds_one_table_per_width():
    # rope.py imports nothing of minitx's: the model and the kinds both import it, so none of
    # them has to import another inside a function to rotate (the import circle MLA had).
    source = Path(minitx.rope.__file__).read_text(encoding="utf-8")
    assert not re.search(r"^\s*(from|import)\s+(\.|minitx)", source, re.MULTILINE)

    def mla_model(d_model: int) -> Transformer:  # 2 heads; MLA's rotary width d_r is 16
        return Transformer(
            ModelConfig(
                vocab_size=40, block_size=16, n_layer=3, d_model=d_model, n_head=2, attention={"kind": "mla"}
            )
        )

    model = mla_model(64)  # head_dim 32: the model's table and one of d_r for all MLA layers
    assert len({id(block.attn.rotary) for block in model.blocks}) == 1
    assert model.blocks[0].attn.rotary is not model.rope
    narrow = mla_model(32)  # head_dim 16 = d_r: every layer turns by the model's own table
    assert all(block.attn.rotary is narrow.rope for block in narrow.blocks)
    assert not any("rotary" in key or "rope" in key for key in model.state_dict())  # never saved
    # Two models never share one: moving one to a device or dtype must not move the other's.
    assert mla_model(64).blocks[0].attn.rotary is not model.blocks[0].attn.rotary


# -- shapes and parameter counts -----------------------------------------------------------------------


def attention_params(model: Transformer, part: str) -> int:
    return sum(p.numel() for name, p in model.named_parameters() if f"attn.{part}" in name)


@pytest.mark.parametrize("kind, n_kv_head", [("gqa", 2), ("mqa", None), ("local", 1), ("mta", 2)])
def test_kv_projections_shrink_by_kv_heads_over_heads(kind, n_kv_head):
    mha = Transformer(tiny(kind="mha"))
    other = Transformer(tiny(kind=kind, n_kv_head=n_kv_head))
    c = other.config
    G, H, D = c.n_kv_head_at(0), c.n_head, c.head_dim
    # One fused projection per layer: n_head query heads and n_kv_head key and value heads, no biases.
    assert attention_params(mha, "qkv_proj") == c.n_layer * c.d_model * 3 * H * D
    assert attention_params(other, "qkv_proj") == c.n_layer * c.d_model * (H + 2 * G) * D
    assert attention_params(other, "out_proj") == attention_params(mha, "out_proj")


@pytest.mark.parametrize("head_mix, group", [("both", None), ("pre", 2), ("none", None)])
def test_mta_extra_parameters_match_formula(head_mix, group):
    n_layer, H, D, c_q, c_k = 8, 4, 8, 6, 11
    config = tiny(
        n_layer=n_layer,
        n_head=H,
        d_model=H * D,
        kind="mta",
        options={"mta": {"head_mix": head_mix, "head_group": group}},
    )
    c_h = group or H
    n_conv_layers = len(range(2, n_layer, 4))  # every 4th layer from layer 2: 2 and 6
    # Per conv layer H kernels c_q x c_k; per layer a pre-softmax mix of H x H (as released, never
    # grouped) and a post-softmax one of (H / c_h) blocks of c_h x c_h; per layer a shared RMSNorm
    # weight (D) and the gate Linear(D -> 1) with its bias.
    mixes = (H * H if head_mix in ("pre", "both") else 0) + (H * c_h if head_mix in ("post", "both") else 0)
    expected = n_conv_layers * H * c_q * c_k + n_layer * mixes + n_layer * (2 * D + 1)
    extra = (
        Transformer(config).num_params()
        - Transformer(tiny(n_layer=n_layer, n_head=H, d_model=H * D)).num_params()
    )
    assert extra == expected


@pytest.mark.parametrize("positions, tied", [("rope", True), ("learned", True), ("learned", False)])
def test_the_two_parameter_counts_say_what_they_leave_out(positions, tied):
    """num_params: every parameter once but the position table (nanoGPT's, what train prints);
    non_embedding_params: a ladder's N, without the token table, the output layer and the position
    table too (the ablation's params_non_embedding)."""
    from minitx.ablation.plan.budget import model_budget

    config = dataclasses.replace(tiny(), positions=positions, tie_embeddings=tied)
    model = Transformer(config)
    V, D, T = config.vocab_size, config.d_model, config.block_size
    table = V * D
    positions_table = T * D if positions == "learned" else 0
    everything = sum(p.numel() for p in model.parameters())  # each once: a tied head is the table
    assert everything == model.num_params(positions=True)
    assert model.num_params() == everything - positions_table
    head = 0 if tied else table
    assert model.non_embedding_params() == everything - table - head - positions_table
    assert model_budget(model)["params_non_embedding"] == model.non_embedding_params()
    assert model_budget(model)["params"] == everything


def test_logits_shape_and_too_long_input():
    model = Transformer(tiny(kind="gqa", n_kv_head=2))
    assert model(torch.randint(0, VOCAB, (3, 10))).shape == (3, 10, VOCAB)
    with pytest.raises(ValueError, match="block_size"):
        model(torch.randint(0, VOCAB, (1, BLOCK + 1)))


@pytest.mark.parametrize("name", ["mha", "local-global-gqa", "mta-gqa", "mixed-local-mha"])
def test_attention_maps(name):
    config = case_config(name)
    model = Transformer(config).eval()  # untrained: MTA's post-softmax mixing would break row sums
    T_maps = 70
    maps = model.attention_maps(torch.randint(0, VOCAB, (2, T_maps)))
    assert len(maps) == config.n_layer
    i, j = torch.arange(T_maps)[:, None], torch.arange(T_maps)[None, :]
    for layer, weights in enumerate(maps):
        assert weights.shape == (2, config.n_head, T_maps, T_maps)
        assert torch.allclose(weights.sum(-1), torch.ones(2, config.n_head, T_maps), atol=1e-5)
        assert (weights[..., j > i] == 0).all()
        if config.layer_kinds[layer] == "local":
            att = config.attention.options_of("local")
            outside = (i - j >= att.window) & (j >= att.n_global)
            assert (weights[..., outside & (j <= i)] == 0).all()


# -- each layer makes its cache; RMSNorm from torch ---------------------------------------------------


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


def test_each_layer_makes_its_kinds_cache_and_a_reset_cache_starts_afresh():
    model = build(
        tiny(
            n_layer=3,
            layers=["mta", "local", "gqa"],
            options={
                "local": {"window": 5},
                "mta": {"conv_layers": [0], "query_kernel": 3, "key_kernel": 3, "query_chunk": 4},
            },
            n_kv_head=2,
        )
    )
    seq = torch.randint(0, VOCAB, (2, 14))
    with torch.no_grad():
        expected = model(seq)
        cache = model.new_cache(batch=2, max_len=14)
        caches = list(cache.layers)
        assert [type(layer) for layer in caches] == [MTACache, KVCache, KVCache]
        assert not hasattr(caches[1], "queries")  # query history is MTA's alone
        assert cache.state_dict() == {}  # cache buffers are not persistent
        for _ in range(2):  # the second pass after reset sees nothing of the first
            steps = [model(seq[:, :4], cache)] + [model(seq[:, t : t + 1], cache) for t in range(4, 14)]
            assert max_diff(torch.cat(steps, dim=1), expected) < 1e-5
            cache.reset()
            assert all(layer.n_seen == 0 for layer in caches) and caches[0].query_pos.eq(-1).all()


def test_rmsnorm_is_torch_with_checkpoint_compatible_weight_and_eps():
    model = Transformer(tiny())
    norm = model.blocks[0].norm1
    assert isinstance(norm, torch.nn.RMSNorm) and norm.eps == 1e-6
    assert {"blocks.0.norm1.weight", "blocks.0.norm2.weight", "norm.weight"} <= set(model.state_dict())
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(3, 5, 32)
    written_out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    assert max_diff(norm(x), written_out) < 1e-5
