"""Gated DeltaNet (gdn): its three paths against each other, transformers' Qwen3-Next, its cache.

- the chunked form (WY/UT transform) equals the token loop in float64 at awkward sizes (T = 1, no
  multiple of the chunk, grouped value heads, an initial state, documents starting mid-chunk);
- the layer equals transformers' `Qwen3NextGatedDeltaNet` with copied weights, and the chunked
  function its `torch_chunk_gated_delta_rule`, in float32;
- prefill then one-token steps through the cache equal the full forward; greedy decoding with the
  cache equals decoding without it; the cache (convolution window and float32 state) does not grow
  with the context, and decoding goes on past block_size exactly;
- padding: a step that neither decays nor writes is the identity on the state (flash-linear-
  attention's #1272); padding before a prompt's document token changes neither the state nor the
  convolution window, in one pass or token by token, and a left-padded batch decodes as each
  prompt alone;
- attention_weights is the linear map the layer applies (maps and diagnostics read it);
- bad options are one-line errors naming the option.

Causality (gdn and the 3:1 hybrid) and documents ([doc A][doc B] at B's positions equals [doc B]
alone, in one pass and through the cache) are the tables every kind is held to:
tests/model/test_model.py (KIND_CASES) and tests/model/test_documents.py.

transformers dispatches to flash-linear-attention and causal-conv1d whenever they import, with no
device check: its torch functions are the reference only where they are not installed, so the
comparisons skip with that reason otherwise.

Each test draws a fresh seed (printed in the captured output of a failure); set MINITX_TEST_SEED
to replay one.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from helpers import fla_stand_in

from minitx import AttentionConfig, ModelConfig, Transformer, kv_cache_bytes
from minitx.attention.gdn import (
    FEW_TOKENS,
    GatedDeltaNet,
    chunk_gated_delta,
    recurrent_gated_delta,
    step_gated_delta,
)
from minitx.decoding.loop import generate
from minitx.errors import UserError
from minitx.verify import cached_logits

pytestmark = pytest.mark.usefixtures("seed", "one_thread")

VOCAB = 32
KERNELS = [name for name in ("fla", "causal_conv1d") if importlib.util.find_spec(name) is not None]
needs_torch_reference = pytest.mark.skipif(
    bool(KERNELS),
    reason=f"{', '.join(KERNELS)} installed: transformers would run those kernels instead of its torch reference",
)


def inputs(B, Hk, Hv, T, dk, dv, dtype=torch.float64):
    """Random q, k (unit keys, as the layer makes them), v, g <= 0 and beta in (0, 1); key heads
    repeated over their value heads as the layer does."""
    q = torch.randn(B, Hk, T, dk, dtype=dtype)
    k = F.normalize(torch.randn(B, Hk, T, dk, dtype=dtype), dim=-1)
    q, k = q.repeat_interleave(Hv // Hk, 1), k.repeat_interleave(Hv // Hk, 1)
    v = torch.randn(B, Hv, T, dv, dtype=dtype)
    g = -torch.rand(B, Hv, T, dtype=dtype) * 2
    beta = torch.rand(B, Hv, T, dtype=dtype)
    return q, k, v, g, beta


@pytest.mark.parametrize("T", [1, 5, 37, 67])
def test_chunked_form_equals_the_token_loop_in_float64(T):
    q, k, v, g, beta = inputs(2, 2, 4, T, 6, 5)
    state = torch.randn(2, 4, 6, 5, dtype=torch.float64)
    resets = torch.rand(2, T) < 0.15  # documents starting anywhere, mid-chunk included
    for reset in (None, resets):
        for carried in (None, state):
            want_o, want_h = recurrent_gated_delta(q, k, v, g, beta, 0.4, carried, reset)
            for C in (1, 16, 64):
                o, h = chunk_gated_delta(q, k, v, g, beta, 0.4, C, carried, reset)
                assert (o - want_o).abs().max() < 1e-12, (C, reset is None, carried is None)
                assert (h - want_h).abs().max() < 1e-12
    # DeltaNet is the same rule without decay: g = 0.
    o, _ = chunk_gated_delta(q, k, v, torch.zeros_like(g), beta, 0.4, 16)
    assert (o - recurrent_gated_delta(q, k, v, torch.zeros_like(g), beta, 0.4)[0]).abs().max() < 1e-12


def test_decoding_step_equals_the_token_loop_in_float64():
    q, k, v, g, beta = inputs(3, 2, 4, 1, 6, 5)
    state = torch.randn(3, 4, 6, 5, dtype=torch.float64)
    for reset in (None, torch.tensor([[True], [False], [True]])):
        want_o, want_h = recurrent_gated_delta(q, k, v, g, beta, 0.4, state, reset)
        o, h = step_gated_delta(q, k, v, g, beta, 0.4, state, reset)
        assert (o - want_o).abs().max() < 1e-12 and (h - want_h).abs().max() < 1e-12, reset


@needs_torch_reference
def test_chunked_function_equals_transformers_torch_chunk_gated_delta_rule():
    from transformers.models.qwen3_next import modeling_qwen3_next as qwen3_next

    B, Hk, Hv, T, dk, dv = 2, 2, 4, 75, 8, 6
    q, k, v, g, beta = inputs(B, Hk, Hv, T, dk, dv, dtype=torch.float32)
    state = torch.randn(B, Hv, dk, dv)
    ours, our_state = chunk_gated_delta(q, k, v, g, beta, dk**-0.5, 64, state)
    # transformers takes (B, T, H, D), key heads unrepeated, and repeats them itself.
    theirs, their_state = qwen3_next.torch_chunk_gated_delta_rule(
        *(t[:, :: Hv // Hk].transpose(1, 2) for t in (q, k)),
        *(t.transpose(1, 2) for t in (v, g, beta)),
        chunk_size=64,
        initial_state=state,
        output_final_state=True,
    )
    assert (ours - theirs.transpose(1, 2)).abs().max() < 1e-5
    assert (our_state - their_state).abs().max() < 1e-5


def gdn_config(block_size=96, n_layer=1, layers=None, document_token=None, **options) -> ModelConfig:
    return ModelConfig(
        vocab_size=VOCAB,
        block_size=block_size,
        n_layer=n_layer,
        n_head=2,
        d_model=32,
        document_token=document_token,
        attention=AttentionConfig(kind="gdn", layers=layers, options={"gdn": options}),
    )


def copy_qwen3_next(theirs, ours: GatedDeltaNet) -> None:
    """transformers' weights into minitx's layout. Its in_proj_qkvz interleaves per key head
    [q (dk) | k (dk) | v (r dv) | z (r dv)] and its in_proj_ba [b (r) | a (r)], r value heads per
    key head; minitx keeps one projection each, heads in order, so the rows are regrouped."""
    Hk, dk, dv, d = ours.n_head, ours.key_dim, ours.value_dim, theirs.hidden_size
    r = ours.n_value_head // Hk
    q, k, v, z = theirs.in_proj_qkvz.weight.view(Hk, 2 * dk + 2 * r * dv, d).split(
        [dk, dk, r * dv, r * dv], 1
    )
    b, a = theirs.in_proj_ba.weight.view(Hk, 2 * r, d).split([r, r], 1)
    with torch.no_grad():
        for mine, weight in [
            ("q_proj", q),
            ("k_proj", k),
            ("v_proj", v),
            ("g_proj", z),
            ("b_proj", b),
            ("a_proj", a),
        ]:
            getattr(ours, mine).weight.copy_(weight.reshape(-1, d))
        ours.conv.weight.copy_(theirs.conv1d.weight)  # both convolve [q | k | v], heads in order
        ours.A_log.copy_(theirs.A_log)
        ours.dt_bias.copy_(theirs.dt_bias)
        ours.norm.weight.copy_(theirs.norm.weight)
        ours.out_proj.weight.copy_(theirs.out_proj.weight)


@needs_torch_reference
@pytest.mark.parametrize("value_heads", [2, 4])
@pytest.mark.parametrize("T", [1, 5, 75])  # the convolution as products (<= FEW_TOKENS) and conv1d
def test_layer_equals_transformers_qwen3_next_gated_deltanet(value_heads, T):
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next import modeling_qwen3_next as qwen3_next

    config = gdn_config(key_head_dim=8, value_head_dim=6, n_value_head=value_heads)
    hf = Qwen3NextConfig(
        hidden_size=32,
        linear_num_key_heads=2,
        linear_num_value_heads=value_heads,
        linear_key_head_dim=8,
        linear_value_head_dim=6,
        linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6,
        num_hidden_layers=1,
        layer_types=["linear_attention"],
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    theirs = qwen3_next.Qwen3NextGatedDeltaNet(hf, 0).eval()
    with torch.no_grad():  # far from the init, so every part matters (norm weights off 1)
        for param in theirs.parameters():
            param.normal_(0, 0.3)
    ours = GatedDeltaNet(config, 0).eval()
    copy_qwen3_next(theirs, ours)
    assert 5 <= FEW_TOKENS < 75
    x = torch.randn(2, T, 32)  # 75: a chunk of 64 and a partial one
    with torch.no_grad():
        # Both sides run in float32 (theirs casts to it), and with weights this far from the init
        # the rounding of 75 steps reaches 1.7e-5 on about one draw in a hundred (300 draws
        # measured); a dt_bias off by 0.01 moves the output by 5.6e-3 or more (40 draws).
        assert (ours(x) - theirs(x)).abs().max() < 1e-4


def random_model(config: ModelConfig) -> Transformer:
    model = Transformer(config)
    with torch.no_grad():  # random, not the init: logits far from ties, every part matters
        for name, param in model.named_parameters():
            if not name.endswith(("A_log", "dt_bias")):
                param.copy_(0.4 * torch.randn_like(param))
    return model.eval()


CACHE_CASES = {
    "gdn": dict(chunk_size=16),
    "deltanet-grouped-neg-eigval": dict(chunk_size=16, n_value_head=4, decay=False, allow_neg_eigval=True),
    "hybrid": dict(chunk_size=16, layers=["gdn", "gdn", "gdn", "mha"], n_layer=4),
}


def cache_config(name: str, **changes) -> ModelConfig:
    options = dict(CACHE_CASES[name])
    layers, n_layer = options.pop("layers", None), options.pop("n_layer", 2)
    return gdn_config(n_layer=n_layer, layers=layers, **{**options, **changes})


@pytest.mark.parametrize("name", list(CACHE_CASES))
def test_prefill_and_steps_through_the_cache_equal_the_full_forward(name):
    model = random_model(cache_config(name))
    seq = torch.randint(0, VOCAB, (2, 40))
    with torch.no_grad():
        full = model(seq)
    for prompt_len in (1, 19):  # one token; more than a chunk and not a multiple of it
        assert (cached_logits(model, seq, prompt_len) - full[:, prompt_len - 1 :]).abs().max() < 1e-4


@pytest.mark.parametrize("name", ["gdn", "hybrid"])
def test_greedy_decoding_with_and_without_the_cache_agree(name):
    model = random_model(cache_config(name, chunk_size=8))
    prompt = torch.randint(0, VOCAB, (2, 3))
    with_cache = generate(model, prompt, 40, temperature=0)
    assert torch.equal(with_cache, generate(model, prompt, 40, temperature=0, use_cache=False))


def test_cache_does_not_grow_with_the_context():
    config = gdn_config(n_layer=2, key_head_dim=8, value_head_dim=6, n_value_head=4, conv_size=3)
    # Per layer: the last 2 inputs of 2 x 2 x 8 + 4 x 6 channels, and 4 states of 8 x 6, float32.
    per_layer = (2 * (2 * 2 * 8 + 4 * 6) + 4 * 8 * 6) * 4
    for length in (1, 96, 100_000):
        assert kv_cache_bytes(config, length, batch=3) == 2 * 3 * per_layer
    assert Transformer(config).new_cache(batch=3, max_len=50).nbytes() == 2 * 3 * per_layer
    # The state stays float32 under a half-precision cache; the window takes the model's dtype.
    half = kv_cache_bytes(config, 10, dtype=torch.bfloat16)
    assert half == 2 * ((2 * (2 * 2 * 8 + 4 * 6)) * 2 + 4 * 8 * 6 * 4)
    # A hybrid's softmax layer grows with the context as its kind does; its gdn layers do not.
    hybrid = gdn_config(n_layer=4, layers=["gdn", "gdn", "gdn", "mha"])
    assert kv_cache_bytes(hybrid, 80) - kv_cache_bytes(hybrid, 40) == 2 * 40 * 32 * 4


def test_decoding_past_block_size_is_exact():
    """A gdn layer has no positions: with the cache it goes on past block_size as a model with a
    longer context computes in one pass (a prompt longer than the block included)."""
    short = random_model(gdn_config(block_size=16, n_layer=2, chunk_size=8))
    long = Transformer(gdn_config(block_size=64, n_layer=2, chunk_size=8)).eval()
    long.load_state_dict(short.state_dict())
    seq = torch.randint(0, VOCAB, (2, 45))
    with torch.no_grad():
        full = long(seq)
    for prompt_len in (5, 21):
        assert (cached_logits(short, seq, prompt_len) - full[:, prompt_len - 1 :]).abs().max() < 1e-4
    assert generate(short, seq[:, :3], 30, temperature=0).shape == (2, 33)


def test_options_are_checked_in_one_line():
    with pytest.raises(
        UserError, match=r"attention\.options\.gdn\.n_value_head: is 3, not a multiple of n_head=2"
    ):
        gdn_config(n_value_head=3)
    with pytest.raises(UserError, match=r"attention\.options\.gdn\.chunk_size: is 0; use a positive size"):
        gdn_config(chunk_size=0)
    with pytest.raises(UserError, match=r"attention\.options\.gdn\.backend: unknown value 'triton'"):
        gdn_config(backend="triton")
    if not importlib.util.find_spec("fla"):
        with pytest.raises(UserError, match=r"backend: is fla, but flash-linear-attention is not installed"):
            gdn_config(backend="fla")


def test_a_step_that_neither_decays_nor_writes_leaves_the_state_unchanged():
    """A step with g = 0 and beta = 0 is the identity on the state, whatever its q, k and v: the
    chunked form pads its last chunk with such steps. Masking a padded step's value but not its
    decay is flash-linear-attention's issue #1272; here the decayed step must show."""
    q, k, v, g, beta = inputs(2, 2, 4, 29, 6, 5)
    g = g / 20  # long memories: a wrongly decayed step shows in every later output
    state = torch.randn(2, 4, 6, 5, dtype=torch.float64)
    want_o, want_h = chunk_gated_delta(q, k, v, g, beta, 0.4, 8, state)
    real = torch.ones(29 + 7, dtype=torch.bool)
    real[torch.randperm(29 + 7)[:7]] = False  # seven padded steps anywhere, mid-chunk included
    padded = inputs(2, 2, 4, 29 + 7, 6, 5)  # their q, k, v: random content
    q2, k2, v2, g2, beta2 = (p.clone() for p in padded)
    for mine, ours in ((q2, q), (k2, k), (v2, v), (g2, g), (beta2, beta)):
        mine[:, :, real] = ours
    g2[:, :, ~real], beta2[:, :, ~real] = 0.0, 0.0
    for C in (8, 64):
        o, h = chunk_gated_delta(q2, k2, v2, g2, beta2, 0.4, C, state)
        assert (o[:, :, real] - want_o).abs().max() < 1e-12 and (h - want_h).abs().max() < 1e-12
    g2[:, :, ~real] = -0.5  # the value masked, the decay not
    o, h = chunk_gated_delta(q2, k2, v2, g2, beta2, 0.4, 8, state)
    assert (h - want_h).abs().max() > 1e-2 and (o[:, :, real] - want_o).abs().max() > 1e-2


DOC = 0  # the document token of the padding tests


def gdn_layers(model: Transformer, cache) -> list:
    return [c for block, c in zip(model.blocks, cache.layers) if isinstance(block.attn, GatedDeltaNet)]


@pytest.mark.parametrize("name", ["gdn", "hybrid"])
def test_padding_before_a_document_changes_neither_the_state_nor_the_window(name):
    """Padding in minitx: prompts of unequal lengths in one batch are left-padded with any tokens,
    each prompt starting with the document token (ModelConfig.document_token); there is no attention
    mask. The document start empties the state and the convolution window, so whatever the padding
    holds, each row's cache (state and window) after its prompt is the prompt's alone, prefilled in
    one pass or fed token by token; its logits and greedy continuation are the prompt's alone. Without
    documents the same padding does move the state: the comparison can see a leak."""
    model = random_model(cache_config(name, chunk_size=8, document_token=DOC))
    prompts = [torch.randint(1, VOCAB, (n,)) for n in (2, 13)]  # 2: the window reaches into the padding
    for prompt in prompts:
        prompt[0] = DOC
    width = 19  # row 0: 17 tokens of padding; row 1: 6 (7 and 19: not multiples of the chunk)
    alone_caches, alone_logits = [], []
    with torch.no_grad():
        for prompt in prompts:
            cache = model.new_cache(1, width)
            alone_logits.append(model(prompt[None], cache)[0])
            alone_caches.append(gdn_layers(model, cache))
        for fill in range(2):  # two paddings of different content
            batch = torch.randint(1, VOCAB, (2, width))
            for row, prompt in enumerate(prompts):
                batch[row, width - len(prompt) :] = prompt
            one_pass, stepped = model.new_cache(2, width), model.new_cache(2, width)
            logits = model(batch, one_pass)
            steps = torch.cat([model(batch[:, t : t + 1], stepped) for t in range(width)], dim=1)
            for row, prompt in enumerate(prompts):
                real = slice(width - len(prompt), width)
                assert (logits[row, real] - alone_logits[row]).abs().max() < 1e-4, (fill, row)
                assert (steps[row, real] - alone_logits[row]).abs().max() < 1e-4, (fill, row)
                for cache in (one_pass, stepped):
                    for ours, theirs in zip(gdn_layers(model, cache), alone_caches[row]):
                        assert (ours.state[row] - theirs.state[0]).abs().max() < 1e-5, (fill, row)
                        assert (ours.conv[row] - theirs.conv[0]).abs().max() < 1e-5, (fill, row)
        continued = generate(model, batch, 12, temperature=0)[:, width:]
        for row, prompt in enumerate(prompts):
            assert torch.equal(
                continued[row], generate(model, prompt[None], 12, temperature=0)[0, len(prompt) :]
            )
        leaky = Transformer(cache_config(name, chunk_size=8)).eval()
        leaky.load_state_dict(model.state_dict())
        cache = leaky.new_cache(2, width)
        leaky(batch, cache)
        state = gdn_layers(leaky, cache)[0].state[0]
        alone = leaky.new_cache(1, width)
        leaky(prompts[0][None], alone)
        assert (state - gdn_layers(leaky, alone)[0].state[0]).abs().max() > 1e-3


@pytest.mark.parametrize("value_heads", [2, 4])
def test_attention_map_is_the_linear_map_the_layer_applies(value_heads):
    """attention_weights: the materialised M with o_t = sum_j M_tj v_j from an empty state (against
    the token loop in float64), lower triangular; the maps of a hybrid: M for its gdn layers, the
    softmax weights for its mha layer."""
    model = random_model(
        gdn_config(n_layer=4, layers=["gdn", "gdn", "gdn", "mha"], chunk_size=8, n_value_head=value_heads)
    )
    layer = model.blocks[0].attn
    x = torch.randn(2, 21, 32)
    with torch.no_grad():
        M = layer.attention_weights(x)
        q, k, v, g, beta, _ = layer.recurrence_inputs(x, None, None, 0)
        o, _ = recurrent_gated_delta(*(t.double() for t in (q, k, v, g, beta)), layer.scale)
    assert M.shape == (2, value_heads, 21, 21) and M.triu(1).abs().max() == 0
    assert (M.double() @ v.double() - o).abs().max() < 1e-5
    maps = model.attention_maps(torch.randint(0, VOCAB, (1, 21)))
    assert [m.shape[1] for m in maps] == [value_heads] * 3 + [2]
    assert torch.allclose(maps[3].sum(-1), torch.ones(1, 2, 21))  # the softmax layer's rows
    assert layer.softmax_maps(x) == []  # no distribution for the diagnostics


@pytest.mark.parametrize("name", ["gdn", "deltanet-grouped-neg-eigval", "hybrid"])
def test_documents_through_fla_s_packed_sequences_equal_the_torch_path(name, monkeypatch):
    """On CUDA with flash-linear-attention, packed documents go to fla's kernel as packed sequences
    (gdn.delta_rule.fla_chunk: the batch one row, cut where documents start, cu_seqlens). Rehearsed
    on the CPU with a stand-in for the kernel (tests/helpers.py) in float64: the whole forward, and
    a prefill in two pieces through the cache, where a row's first sequence goes on from the row's
    state unless a document starts it, equal the torch path, states included."""
    from minitx.attention import gdn

    calls = []

    def kernel():
        calls.append(1)
        return fla_stand_in(chunk_size=8)

    monkeypatch.setattr(gdn.delta_rule, "fla_installed", lambda: True)
    monkeypatch.setattr(gdn.delta_rule, "fla_kernel", kernel)
    monkeypatch.setattr(GatedDeltaNet, "use_fla", lambda self, q: self.backend == "fla")
    torch_path = random_model(cache_config(name, document_token=DOC)).double()
    fla_path = Transformer(cache_config(name, document_token=DOC, backend="fla")).double().eval()
    fla_path.load_state_dict(torch_path.state_dict())
    seq = torch.randint(1, VOCAB, (3, 40))
    seq[0, 0] = seq[0, 13] = DOC  # a document from the start, one mid-chunk
    seq[1, 21] = DOC  # the second piece of the prefill begins inside a document, then another
    seq[2, 20] = seq[2, 27] = seq[2, 28] = DOC  # one at the second piece's start; one of one token
    with torch.no_grad():
        full = torch_path(seq)
        assert (fla_path(seq) - full).abs().max() < 1e-10
        n_gdn = sum(isinstance(block.attn, GatedDeltaNet) for block in fla_path.blocks)
        assert len(calls) == n_gdn
        caches = {}
        for label, model in (("torch", torch_path), ("fla", fla_path)):
            caches[label] = model.new_cache(3, 40)
            first = model(seq[:, :20], caches[label])
            second = model(seq[:, 20:], caches[label])
            # (the cache keeps the state in float32)
            assert (torch.cat([first, second], dim=1) - full).abs().max() < 1e-6, label
        assert len(calls) == 3 * n_gdn
        for ours, theirs in zip(gdn_layers(fla_path, caches["fla"]), gdn_layers(torch_path, caches["torch"])):
            assert (ours.state - theirs.state).abs().max() < 1e-6
