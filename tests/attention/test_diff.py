"""Differential attention (diff): its paths against the oracle, its maps, and DiffLlama.

- the fast path against the materialised reference and the paper's formula written out head pair
  by head pair, at awkward lengths, with GQA, gradients too; the CPU's tiles (DifferenceOfMaps)
  and their hand-written backward in float64 at several tiles, gradcheck, masks, CPU autocast;
  the fused SDPA call (decoding's and a GPU's path) against the reference;
- lambda_init by depth (0-based layers) or set; the attention maps (H/2 differential maps);
- decoding from the KV cache against the full forward, with and without GQA;
- the layer against transformers' `DiffLlamaAttention` with copied weights at several depths; the
  export as a native DiffLlamaForCausalLM (logits, greedy tokens) and the import back, also of a
  directory transformers wrote itself;
- bad options and unsupported models are one-line errors naming the setting.

The generic tables (causality with teeth, prefixes, cached == uncached decoding past the context,
compile without graph breaks) hold diff too: tests/model/ and tests/generation/.

Each test draws a fresh seed (printed in the captured output of a failure); set MINITX_TEST_SEED
to replay one.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import export_model, load_quietly

from minitx import AttentionConfig, ModelConfig, Transformer, functional
from minitx.attention import build, diff
from minitx.attention.diff import DifferenceOfMaps, DifferentialAttention, lambda_init_at
from minitx.data.tokenizer import CharTokenizer
from minitx.errors import UserError
from minitx.rope import RotaryEmbedding
from minitx.verify import cached_logits

pytestmark = pytest.mark.usefixtures("seed", "one_thread")

TOL = 1e-5
TEXT = "to be or not to be, that is the question.\n"


def config(n_layer: int = 1, n_kv_head: int | None = None, **options) -> ModelConfig:
    return ModelConfig(
        vocab_size=16,
        block_size=96,
        n_layer=n_layer,
        n_head=4,
        d_model=32,
        attention=AttentionConfig(kind="diff", n_kv_head=n_kv_head, options={"diff": options}),
    )


def layer(layer_index: int = 0, n_kv_head: int | None = None, **options) -> DifferentialAttention:
    module = build(config(layer_index + 1, n_kv_head, **options), layer_index).eval()
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.startswith("lambda"):
                param.copy_(0.3 * torch.randn_like(param))  # lambda well away from lambda_init
    return module


def formula(module: DifferentialAttention, q, k, v) -> torch.Tensor:
    """The paper's differential head written out pair by pair: (A1 - lambda A2) [v_g, v_{g+G/2}],
    RMS-normed, times (1 - lambda_init)."""
    B, H, T, D = q.shape
    G = k.shape[1]
    lam = math.exp((module.lambda_q1 * module.lambda_k1).sum()) - math.exp(
        (module.lambda_q2 * module.lambda_k2).sum()
    )
    lam += module.lambda_init
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    outs = []
    for i in range(H // 2):
        g = i // (H // G)
        a1 = torch.softmax(
            (q[:, i] @ k[:, g].transpose(-1, -2) / math.sqrt(D)).masked_fill(future, -math.inf), -1
        )
        j, h = i + H // 2, g + G // 2
        a2 = torch.softmax(
            (q[:, j] @ k[:, h].transpose(-1, -2) / math.sqrt(D)).masked_fill(future, -math.inf), -1
        )
        out = (a1 - lam * a2) @ torch.cat([v[:, g], v[:, h]], dim=-1)
        outs.append((1 - module.lambda_init) * out / out.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt())
    return torch.stack(outs, dim=1)


@pytest.mark.parametrize("T", [1, 7, 23])
@pytest.mark.parametrize("n_kv_head", [4, 2])
def test_fast_path_equals_the_reference_and_the_formula(n_kv_head, T):
    module = layer(2, n_kv_head)
    x = torch.randn(2, T, 32, requires_grad=True)
    q, k, v = module.project(x, RotaryEmbedding(8, 96)(0, T))
    fast, (slow, maps) = module.attend(q, k, v), module.reference(q, k, v)
    assert fast.shape == (2, 2, T, 16) and maps.shape == (2, 2, T, T)
    assert (fast - slow).abs().max() < TOL
    with torch.no_grad():
        assert (slow - formula(module, q, k, v)).abs().max() < TOL
    grad = torch.randn_like(fast)
    params = [
        x,
        module.qkv_proj.weight,
        module.lambda_q1,
        module.lambda_k1,
        module.lambda_q2,
        module.lambda_k2,
    ]
    got = torch.autograd.grad(fast, params, grad, retain_graph=True)  # q, k, v are shared
    for a, b in zip(got, torch.autograd.grad(slow, params, grad)):
        assert (a - b).abs().max() < 1e-4 * max(1.0, b.abs().max().item())


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles of one sequence by 8 queries: several of each at test sizes, the last one partial."""
    monkeypatch.setattr(diff, "QUERY_CHUNK", 8)
    monkeypatch.setattr(diff, "TILE_SCORES", 1)


def float64_inputs(module: DifferentialAttention, T: int):
    module.double()
    x = torch.randn(3, T, 32, dtype=torch.float64)
    q, k, v = (t.detach().requires_grad_() for t in module.project(x, RotaryEmbedding(8, 96)(0, T)))
    return q, k, v, [q, k, v, module.lambda_q1, module.lambda_k1, module.lambda_q2, module.lambda_k2]


@pytest.mark.parametrize("T", [1, 8, 21])
@pytest.mark.parametrize("n_kv_head", [4, 2])
def test_tiles_and_their_backward_equal_the_materialised_reference_in_float64(small_tiles, n_kv_head, T):
    """The tiles (DifferenceOfMaps, a CPU's training path) against `reference` to float64's
    precision: outputs, and the gradients of q, k, v and lambda's four vectors through the
    hand-written backward; 21 tokens are three query chunks, the last one partial."""
    module = layer(1, n_kv_head)
    q, k, v, inputs = float64_inputs(module, T)
    fast, (slow, _) = module.attend(q, k, v), module.reference(q, k, v)
    assert (fast - slow).abs().max() < 1e-12
    grad = torch.randn_like(fast)
    got = torch.autograd.grad(fast, inputs, grad)
    for n, (a, b) in enumerate(zip(got, torch.autograd.grad(slow, inputs, grad))):
        # lambda's vectors: through lambda_full's float32 sums (as both paths; gradcheck holds dlambda)
        tol = 1e-12 if n < 3 else 1e-6
        assert (a - b).abs().max() < tol * max(1.0, b.abs().max().item()), n


def test_tiles_pass_gradcheck_with_a_mask(small_tiles):
    """torch's numerical gradcheck of DifferenceOfMaps in float64, causal and under a mask (a
    window of 5 keys, as `differential` gets it from a cache or documents)."""
    q = torch.randn(2, 4, 11, 3, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 2, 11, 3, dtype=torch.float64, requires_grad=True) for _ in range(2))
    lam = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    positions = torch.arange(11)
    window = functional.allowed_mask(positions, positions, window=5).expand(2, 1, 11, 11)
    # fast_mode: the Jacobian's product with random vectors, against finite differences.
    for mask, causal in ((None, True), (window, False)):
        attend = lambda q, k, v, lam, m=mask, c=causal: DifferenceOfMaps.apply(q, k, v, lam, m, c)  # noqa: E731
        assert torch.autograd.gradcheck(attend, (q, k, v, lam), fast_mode=True)


def test_tiles_under_a_mask_equal_the_fused_call(small_tiles):
    """What documents and a sliding context pass: a boolean mask, not causal; against the fused
    SDPA call (decoding's and a GPU's path), which the reference tests above also hold."""
    module = layer(1, 2)
    q, k, v, _ = float64_inputs(module, 21)
    positions = torch.arange(21)
    for mask in (
        functional.allowed_mask(positions, positions, window=6),
        (torch.rand(3, 1, 21, 21) < 0.6) | torch.eye(21, dtype=torch.bool),  # documents' shape
    ):
        with torch.no_grad():
            tiles = module.differential(q, k, v, mask=mask, causal=False)
            fused = module.combine(module.fused(q, k, v, mask=mask, causal=False))
        assert (tiles - fused).abs().max() < 1e-12


def test_fused_call_equals_the_reference():
    module = layer(2, 2)
    q, k, v, _ = float64_inputs(module, 13)
    with torch.no_grad():
        fused = module.combine(module.fused(q, k, v, mask=None, causal=True))
        assert (fused - module.reference(q, k, v)[0]).abs().max() < 1e-12


def test_tiles_train_under_cpu_autocast(small_tiles):
    """bf16 products, float32 maps: gradients within bf16's 2-3 digits of float32's."""
    module = layer(1, 2).train()
    x = torch.randn(2, 21, 32)
    rope = RotaryEmbedding(8, 96)(0, 21)
    expected = torch.autograd.grad(module(x, rope).square().sum(), module.qkv_proj.weight)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module(x, rope)
    (grad,) = torch.autograd.grad(out.float().square().sum(), module.qkv_proj.weight)
    assert grad.dtype == torch.float32
    assert (grad - expected).norm() < 0.05 * expected.norm()


def test_lambda_init_by_depth_or_set():
    assert [round(lambda_init_at(layer), 6) for layer in (0, 1, 5)] == [0.2, 0.355509, 0.666122]
    assert layer(3).lambda_init == lambda_init_at(3)
    assert layer(3, lambda_init=0.5).lambda_init == 0.5


def test_bad_settings_are_one_line_naming_them():
    with pytest.raises(UserError, match=r"attention\.options\.diff\.lambda_std: is -1\.0"):
        config(lambda_std=-1.0)
    with pytest.raises(UserError, match=r"attention\.options\.diff\.lambda_init: is 'a', not a number"):
        config(lambda_init="a")
    with pytest.raises(
        UserError, match=r"^attention\.options\.diff\.lambda_init: is 1\.0; use a value in \[0, 1\)"
    ):
        config(lambda_init=1.0)
    with pytest.raises(
        UserError, match=r"^n_head: is 3, but kind diff pairs query heads; use an even n_head$"
    ):
        ModelConfig(n_head=3, d_model=48, attention=AttentionConfig(kind="diff"))
    with pytest.raises(UserError, match=r"attention\.n_kv_head: is 1, but kind diff pairs key/value heads"):
        config(n_kv_head=1)


def small_model(n_kv_head: int | None, n_layer: int = 2, block_size: int = 16) -> Transformer:
    shape = dict(vocab_size=16, block_size=block_size, n_layer=n_layer, n_head=4, d_model=32)
    model = Transformer(ModelConfig(**shape, attention=AttentionConfig(kind="diff", n_kv_head=n_kv_head)))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lambda" in name:
                param.copy_(0.3 * torch.randn_like(param))
    return model.eval()


@pytest.mark.parametrize("n_kv_head", [None, 2])
def test_cached_decoding_equals_the_full_forward(n_kv_head):
    model = small_model(n_kv_head)
    for prompt_len in (1, 6, 16):
        seq = torch.randint(0, 16, (2, 16))
        with torch.no_grad():
            full = model(seq)[:, prompt_len - 1 :]
        assert (cached_logits(model, seq, prompt_len) - full).abs().max() < 1e-4, prompt_len


def test_attention_maps_are_the_differential_maps():
    """H/2 maps per layer, causal, each row summing to 1 - lambda (A1 and A2 each sum to 1)."""
    model = small_model(2, block_size=32)
    T = 20
    maps = model.attention_maps(torch.randint(0, 16, (2, T)))
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    for block, weights in zip(model.blocks, maps):
        assert weights.shape == (2, 2, T, T) and (weights[..., future] == 0).all()
        expected = 1 - block.attn.lambda_full().item()
        assert (weights.sum(-1) - expected).abs().max() < 1e-5


# -- transformers' DiffLlama -----------------------------------------------------------------------

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")


@pytest.mark.parametrize("layer_index, n_kv_head", [(0, 4), (1, 2), (5, 2)])
def test_layer_equals_diffllama_attention(layer_index, n_kv_head):
    from transformers.models.diffllama.modeling_diffllama import (
        DiffLlamaAttention,
        DiffLlamaRotaryEmbedding,
    )

    H, G, D, T = 4, n_kv_head, 8, 13
    ours = layer(layer_index, n_kv_head)
    hf_config = transformers.DiffLlamaConfig(
        hidden_size=32,
        num_attention_heads=H,
        num_key_value_heads=G,
        head_dim=D,
        num_hidden_layers=layer_index + 1,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    hf_config._attn_implementation = "eager"
    theirs = DiffLlamaAttention(hf_config, layer_index).eval()
    assert theirs.lambda_init == ours.lambda_init
    with torch.no_grad():
        q, k, v = ours.qkv_proj.weight.split([H * D, G * D, G * D])
        for name, weight in (("q_proj", q), ("k_proj", k), ("v_proj", v), ("o_proj", ours.out_proj.weight)):
            getattr(theirs, name).weight.copy_(weight)
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            getattr(theirs, name).copy_(getattr(ours, name))
        x = torch.randn(2, T, 32)
        positions = torch.arange(T)[None].expand(2, T)
        mask = torch.zeros(T, T).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
        expected, _ = theirs(x, DiffLlamaRotaryEmbedding(hf_config)(x, positions), mask[None, None])
        got = ours(x, RotaryEmbedding(D, 96)(0, T))
    assert (got - expected).abs().max() < TOL


def diff_model(seed: int, tokenizer, n_kv_head: int = 2, **fields) -> Transformer:
    shape = dict(vocab_size=tokenizer.vocab_size, block_size=24, n_layer=3, n_head=4, d_model=32)
    attention = AttentionConfig(kind="diff", n_kv_head=n_kv_head)
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(**{**shape, "mlp": "swiglu", **fields}, attention=attention))
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    return model.eval()


def test_export_is_a_native_diffllama_with_equal_logits_and_imports_back(tmp_path, seed):
    from minitx.hf.load import load_hf_model, read_hf_directory

    tokenizer = CharTokenizer(TEXT)
    model = diff_model(seed, tokenizer)
    directory = export_model(tmp_path, model, tokenizer)
    assert not (directory / "modeling_minitx.py").exists()
    theirs = load_quietly(directory)
    assert type(theirs).__name__ == "DiffLlamaForCausalLM"
    tokens = torch.randint(0, tokenizer.vocab_size, (2, 17))
    with torch.no_grad():
        assert (theirs(tokens).logits - model(tokens)).abs().max() < 1e-4
    prompt = tokens[:1, :4]
    assert torch.equal(
        model.generate(prompt, 12, temperature=0), theirs.generate(prompt, max_new_tokens=12, do_sample=False)
    )
    config, state, _ = read_hf_directory(str(directory), log=lambda _: None)
    assert config.attention == model.config.attention and config.layer_kinds == ["diff"] * 3
    assert state.keys() == model.state_dict().keys()
    assert all(torch.equal(state[key], value) for key, value in model.state_dict().items())
    with torch.no_grad():
        assert torch.equal(load_hf_model(str(directory), log=lambda _: None)(tokens), model(tokens))


def test_import_of_a_diffllama_made_by_transformers_gives_its_logits(tmp_path, seed):
    from minitx.hf.load import load_hf_model

    hf_config = transformers.DiffLlamaConfig(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=72,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    theirs = transformers.DiffLlamaForCausalLM(hf_config).eval()
    with torch.no_grad():
        for param in theirs.parameters():
            param.add_(0.1 * torch.randn_like(param))
    theirs.save_pretrained(tmp_path / "dl")
    model = load_hf_model(str(tmp_path / "dl"), log=lambda _: None)
    assert model.config.layer_kinds == ["diff"] * 3 and model.config.n_kv_head_at(0) == 2
    tokens = torch.randint(0, 40, (2, 19))
    with torch.no_grad():
        assert (model(tokens) - theirs(tokens).logits).abs().max() < 1e-4


def test_export_refuses_what_diffllama_cannot_express_saying_what_to_change(tmp_path, seed):
    tokenizer = CharTokenizer(TEXT)
    with pytest.raises(UserError) as error:
        export_model(tmp_path, diff_model(seed, tokenizer, mlp="gelu"), tokenizer)
    assert "mlp=gelu: diff exports only as DiffLlamaForCausalLM, which needs mlp: swiglu;" in str(error.value)
    assert "\n" not in str(error.value) and not (tmp_path / "hf").exists()
    fixed = Transformer(
        ModelConfig(
            vocab_size=tokenizer.vocab_size,
            n_head=4,
            d_model=32,
            mlp="swiglu",
            attention=AttentionConfig(kind="diff", options={"diff": {"lambda_init": 0.5}}),
        )
    )
    with pytest.raises(UserError, match=r"lambda_init=0\.5: .* needs lambda_init: null \(by depth\)"):
        export_model(tmp_path, fixed, tokenizer, "fixed")
    path = export_model(tmp_path, diff_model(seed, tokenizer), tokenizer, "ok") / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "attention_bias": True}))
    from minitx.hf.load import read_hf_directory

    with pytest.raises(UserError, match="attention_bias/mlp_bias cannot be imported for diff"):
        read_hf_directory(str(path.parent), log=lambda _: None)
