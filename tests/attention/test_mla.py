"""Multi-head latent attention (mla): its paths against each other, its cache, and DeepSeek-V3.

- the fast path (SDPA over expanded keys) against the materialised oracle at awkward lengths;
- absorbed decoding (W_uk in the query, W_uv after the sum, attention over the cached latents)
  against the expanded form, token by token and in chunks, past block_size where the context slides;
- the cache holds c_kv and k_rope only, and `kv_cache_bytes` says exactly what it allocates;
- the layer against transformers' `DeepseekV3Attention` with copied weights (q_lora_rank unset and
  set, with biases), the export as a native DeepseekV3ForCausalLM and the import back;
- bad options and unsupported models are one-line errors naming the setting.

The generic tables (causality with teeth, prefixes, cached == uncached decoding past the context)
hold mla too: tests/model/test_model.py and tests/generation/test_generation.py.

Each test draws a fresh seed (printed in the captured output of a failure); set MINITX_TEST_SEED
to replay one.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from helpers import export_model, load_quietly

from minitx import AttentionConfig, ModelConfig, Transformer, functional, kv_cache_bytes
from minitx.attention import build
from minitx.attention.mla import LatentCache, MultiHeadLatentAttention
from minitx.errors import UserError

pytestmark = pytest.mark.usefixtures("seed", "one_thread")

TOL = 1e-5
BLOCK = 8
# Widths that differ from each other and from head_dim (8), so a swapped split shows.
SMALL = dict(kv_lora_rank=12, qk_rope_head_dim=4)
OPTIONS = {
    "plain": SMALL,
    "q-latent-odd-widths": dict(SMALL, q_lora_rank=10, qk_nope_head_dim=6, v_head_dim=5),
}


def config(block_size: int = 96, bias: bool = False, **options) -> ModelConfig:
    return ModelConfig(
        vocab_size=16,
        block_size=block_size,
        n_layer=1,
        n_head=4,
        d_model=32,
        bias=bias,
        attention=AttentionConfig(kind="mla", options={"mla": options}),
    )


def layer(block_size: int = 96, bias: bool = False, **options) -> MultiHeadLatentAttention:
    """Layer 0 of a tiny mla model, every parameter random (norms and biases too)."""
    module = build(config(block_size, bias, **options), 0).eval()
    with torch.no_grad():
        for name, param in module.named_parameters():
            param.copy_(
                1 + 0.2 * torch.randn_like(param) if "norm" in name else 0.3 * torch.randn_like(param)
            )
    return module


def expanded(module: MultiHeadLatentAttention, x: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """The layer's output by the materialised oracle over expanded keys (window: the last `window`
    keys only, as decoding past block_size)."""
    q, k, v = module.project(x)
    y = functional.attention(q, k, v, window=window)
    B, H, T, _ = y.shape
    return module.out_proj(y.transpose(1, 2).reshape(B, T, -1))


# -- the paths of one layer ------------------------------------------------------------------------


@pytest.mark.parametrize("name", OPTIONS)
def test_fast_path_equals_the_materialised_reference(name):
    module = layer(**OPTIONS[name])
    for T in (1, 7, 23):
        x = torch.randn(2, T, 32, requires_grad=True)
        q, k, v = module.project(x)
        assert q.shape[-1] == k.shape[-1] == module.nope_dim + module.rope_dim and v.shape[-1] == module.v_dim
        fast = module.attend(q, k, v)
        slow, weights = module.reference(q, k, v)
        assert (fast - slow).abs().max() < TOL, T
        assert torch.allclose(weights.sum(-1), torch.ones(()), atol=1e-6)
        direction = torch.randn_like(fast)  # a random cotangent: no lucky cancellation
        (grad_fast,) = torch.autograd.grad((fast * direction).sum(), x, retain_graph=True)
        (grad_slow,) = torch.autograd.grad((slow * direction).sum(), x)
        assert (grad_fast - grad_slow).abs().max() < 1e-4, T
        assert (module(x) - expanded(module, x)).abs().max() < TOL, T


@pytest.mark.parametrize("name", OPTIONS)
def test_absorbed_decoding_equals_the_expanded_form_token_by_token_past_the_context(name):
    module = layer(block_size=BLOCK, **OPTIONS[name])
    L = 3 * BLOCK + 3
    x = torch.randn(2, L, 32)
    with torch.no_grad():
        want = expanded(module, x, window=BLOCK)  # past block_size each query sees the last BLOCK keys
        for prompt in (1, 5, BLOCK):
            cache = module.new_cache(2)
            got = [module(x[:, :prompt], cache=cache)]
            got += [module(x[:, t : t + 1], cache=cache) for t in range(prompt, L)]
            assert (torch.cat(got, dim=1) - want).abs().max() < TOL, prompt
            assert cache.n_seen == L
        # A long prompt as decoding feeds it: block_size tokens, then chunks of block_size through
        # the cached path, each new query masked by its own position.
        cache = module.new_cache(2)
        chunks = [module(x[:, t : t + BLOCK], cache=cache) for t in range(0, L, BLOCK)]
        assert (torch.cat(chunks, dim=1) - want).abs().max() < TOL


def test_cached_path_never_expands_keys_per_head(monkeypatch):
    """After the prompt, kv_up (the expansion) is never called: its weight is only read, absorbed."""
    module = layer(**SMALL)
    x = torch.randn(1, 6, 32)
    cache = module.new_cache(1)
    with torch.no_grad():
        module(x[:, :3], cache=cache)
        monkeypatch.setattr(module, "expand", lambda *a: pytest.fail("keys expanded while decoding"))
        for t in range(3, 6):
            module(x[:, t : t + 1], cache=cache)


def test_cache_holds_the_latent_and_the_rotary_key_only():
    options = OPTIONS["q-latent-odd-widths"]
    module = layer(**options)
    cache = module.new_cache(2, max_len=10)
    assert isinstance(cache, LatentCache)
    assert cache.k.shape == (2, 1, 10, options["kv_lora_rank"])
    assert cache.v.shape == (2, 1, 10, options["qk_rope_head_dim"])
    x = torch.randn(2, 4, 32)
    with torch.no_grad():
        module(x, cache=cache)
        latent, rope_key, pos = cache.contents()
        _, c_kv, k_rope = module.compress(x)
        assert torch.equal(pos, torch.arange(4))
        assert torch.equal(latent, c_kv) and torch.equal(rope_key, k_rope)  # normed latent, rotated key
        assert torch.equal(
            c_kv[:, 0], module.kv_latent_norm(module.kv_down(x)[..., : options["kv_lora_rank"]])
        )


def test_cache_bytes_are_exact_and_smaller_than_gqa_at_the_default_width():
    default = ModelConfig(attention=AttentionConfig(kind="mla"))  # d_model 128, 4 heads of 32, 4 layers
    options = default.attention.options_of("mla")
    per_token = (options.kv_lora_rank + options.qk_rope_head_dim) * 4 * default.n_layer  # float32
    model = Transformer(default)
    for T in (1, 37, default.block_size):
        assert kv_cache_bytes(default, T) == model.new_cache(1, T).nbytes() == per_token * T
    assert kv_cache_bytes(default, 10, batch=3, dtype=torch.bfloat16) == per_token // 2 * 10 * 3
    mha = ModelConfig(attention=AttentionConfig(kind="mha"))
    gqa = ModelConfig(attention=AttentionConfig(kind="gqa", n_kv_head=2))
    assert (options.kv_lora_rank, options.qk_rope_head_dim) == (64, 16)
    assert kv_cache_bytes(default, 100) * 16 == kv_cache_bytes(mha, 100) * 5  # 80 numbers vs 256
    assert kv_cache_bytes(default, 100) < kv_cache_bytes(gqa, 100)  # ... vs 128


# -- options -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "option, value",
    [
        ("kv_lora_rank", 0),
        ("q_lora_rank", 0),
        ("qk_rope_head_dim", 5),
        ("qk_nope_head_dim", -1),
        ("v_head_dim", 0),
    ],
)
def test_a_bad_option_is_one_line_naming_it(option, value):
    with pytest.raises(UserError) as error:
        config(**{option: value})
    message = str(error.value)
    assert message.startswith(f"attention.options.mla.{option}: is {value}") and "\n" not in message, message


def test_mla_needs_rope_and_reads_no_n_kv_head():
    with pytest.raises(UserError, match=r"^positions: is 'learned'.*; set positions: rope$"):
        ModelConfig(positions="learned", attention=AttentionConfig(kind="mla"))
    with pytest.raises(UserError, match=r"attention\.n_kv_head: is set to 2"):
        AttentionConfig(kind="mla", n_kv_head=2)
    mixed = ModelConfig(n_layer=2, attention=AttentionConfig(layers=["mla", "local"]))
    assert [mixed.n_kv_head_at(i) for i in range(2)] == [4, 4]


# -- DeepSeek-V3 in transformers ------------------------------------------------------------------------

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")


def deepseek_config(module: MultiHeadLatentAttention, **extra):
    options = module.config.options_at(0)
    hf = transformers.DeepseekV3Config(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_hidden_layers=1,
        first_k_dense_replace=1,
        kv_lora_rank=options.kv_lora_rank,
        q_lora_rank=options.q_lora_rank,
        qk_rope_head_dim=module.rope_dim,
        qk_nope_head_dim=module.nope_dim,
        v_head_dim=module.v_dim,
        rope_interleave=False,
        attention_bias=module.config.bias,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        **extra,
    )
    hf._attn_implementation = "eager"  # the reference: eager_attention_forward
    return hf


@pytest.mark.parametrize("q_lora_rank, bias", [(None, False), (10, True)])
def test_layer_equals_deepseek_v3_attention(q_lora_rank, bias):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3Attention,
        DeepseekV3RotaryEmbedding,
    )

    from minitx.hf.deepseek_v3 import MLA_NAMES

    ours = layer(bias=bias, **dict(SMALL, q_lora_rank=q_lora_rank, qk_nope_head_dim=6, v_head_dim=5))
    hf_config = deepseek_config(ours)
    theirs = DeepseekV3Attention(hf_config, 0).eval()
    renamed = {
        f"{MLA_NAMES['attn.' + name].removeprefix('self_attn.')}.{param}": value
        for key, value in ours.state_dict().items()
        for name, param in [key.rsplit(".", 1)]
    }
    theirs.load_state_dict(renamed, strict=True)  # every tensor of theirs, from ours
    T = 13
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    mask = torch.zeros(T, T).masked_fill(j > i, float("-inf"))[None, None]
    with torch.no_grad():
        x = torch.randn(2, T, 32)
        positions = torch.arange(T)[None].expand(2, T)
        expected, _ = theirs(x, DeepseekV3RotaryEmbedding(hf_config)(x, positions), mask)
        assert (ours(x) - expected).abs().max() < TOL


def mla_model(seed: int, tokenizer, mlp: str = "swiglu", **options) -> Transformer:
    attention = AttentionConfig(kind="mla", options={"mla": dict(SMALL, **options)})
    shape = dict(vocab_size=tokenizer.vocab_size, block_size=48, n_layer=2, n_head=4, d_model=32)
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(**shape, mlp=mlp, attention=attention))
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    return model.eval()


TEXT = "to be or not to be, that is the question.\n"


@pytest.mark.parametrize("q_lora_rank", [None, 10])
def test_export_is_a_native_deepseek_v3_with_equal_logits_and_imports_back(tmp_path, seed, q_lora_rank):
    from minitx.data.tokenizer import CharTokenizer
    from minitx.hf.load import load_hf_model, read_hf_directory

    tokenizer = CharTokenizer(TEXT)
    model = mla_model(seed, tokenizer, q_lora_rank=q_lora_rank)
    directory = export_model(tmp_path, model, tokenizer)
    hf = json.loads((directory / "config.json").read_text())
    assert (
        hf["architectures"] == ["DeepseekV3ForCausalLM"] and not (directory / "modeling_minitx.py").exists()
    )
    assert (hf["first_k_dense_replace"], hf["rope_interleave"], hf["q_lora_rank"]) == (2, False, q_lora_rank)
    theirs = load_quietly(directory)  # no custom code
    assert type(theirs).__name__ == "DeepseekV3ForCausalLM"
    tokens = torch.randint(0, tokenizer.vocab_size, (2, 17))
    with torch.no_grad():
        assert (theirs(tokens).logits - model(tokens)).abs().max() < 1e-4
    prompt = tokens[:1, :4]  # their cache holds the latents too: greedy tokens agree
    assert torch.equal(
        model.generate(prompt, 12, temperature=0), theirs.generate(prompt, max_new_tokens=12, do_sample=False)
    )
    config, state, _ = read_hf_directory(str(directory), log=lambda _: None)
    assert config.attention == model.config.attention and config.layer_kinds == ["mla", "mla"]
    assert state.keys() == model.state_dict().keys()
    assert all(torch.equal(state[key], value) for key, value in model.state_dict().items())
    with torch.no_grad():
        assert torch.equal(load_hf_model(str(directory), log=lambda _: None)(tokens), model(tokens))


def test_import_of_a_deepseek_v3_made_by_transformers_gives_its_logits(tmp_path):
    """A directory transformers wrote itself: q latent, attention biases, untied head, eps 1e-6."""
    from minitx.hf.load import load_hf_model

    hf_config = transformers.DeepseekV3Config(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=72,
        num_hidden_layers=2,
        first_k_dense_replace=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=12,
        q_lora_rank=10,
        qk_rope_head_dim=4,
        qk_nope_head_dim=8,
        v_head_dim=6,
        rope_interleave=False,
        attention_bias=True,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    theirs = transformers.DeepseekV3ForCausalLM(hf_config).eval()
    with torch.no_grad():
        for param in theirs.parameters():
            param.add_(0.1 * torch.randn_like(param))  # biases and norms away from zeros and ones
    theirs.save_pretrained(tmp_path / "ds")
    model = load_hf_model(str(tmp_path / "ds"), log=lambda _: None)
    options = model.config.attention.options_of("mla")
    assert model.config.bias and not model.config.tie_embeddings
    assert (options.qk_nope_head_dim, options.v_head_dim, options.q_lora_rank) == (None, 6, 10)
    tokens = torch.randint(0, 40, (2, 19))
    with torch.no_grad():
        assert (model(tokens) - theirs(tokens).logits).abs().max() < 1e-4


def test_a_run_starts_from_an_exported_directory(tmp_path, seed):
    """`train.py --model.init_from DIR` (minitx/hf/load.py): the run takes mla and its widths from
    the directory when it sets no attention of its own, and loads every weight."""
    from jsonargparse import Namespace

    from minitx.data.tokenizer import CharTokenizer
    from minitx.hf.load import init_model, run_model_fields

    tokenizer = CharTokenizer(TEXT)
    source = mla_model(seed, tokenizer, q_lora_rank=10)
    directory = export_model(tmp_path, source, tokenizer)
    # The run's default attention, as train.py's parser hands it over (a jsonargparse Namespace).
    default = Namespace(**dataclasses.asdict(AttentionConfig()))
    fields = run_model_fields(
        str(directory), dict(block_size=24, dropout=0.0, attention=default), log=lambda _: None
    )
    target = Transformer(ModelConfig(**fields))
    assert target.config.attention == source.config.attention
    init_model(target, str(directory), log=lambda _: None)
    tokens = torch.randint(0, tokenizer.vocab_size, (2, 20))
    with torch.no_grad():
        assert torch.equal(target.eval()(tokens), source(tokens))


def test_export_refuses_what_deepseek_v3_cannot_express_saying_what_to_change(tmp_path, seed):
    from minitx.data.tokenizer import CharTokenizer

    tokenizer = CharTokenizer(TEXT)
    with pytest.raises(UserError) as error:
        export_model(tmp_path, mla_model(seed, tokenizer, mlp="gelu"), tokenizer)
    message = str(error.value)
    assert "mlp=gelu: mla exports only as DeepseekV3ForCausalLM, which needs mlp: swiglu;" in message
    assert "\n" not in message and not (tmp_path / "hf").exists()
    mixed = Transformer(
        ModelConfig(
            vocab_size=tokenizer.vocab_size,
            block_size=16,
            n_layer=2,
            n_head=4,
            d_model=32,
            mlp="swiglu",
            attention=AttentionConfig(layers=["mla", "local"]),
        )
    )
    with pytest.raises(UserError, match=r"attention mla/local: .* needs mla in every layer; set that"):
        export_model(tmp_path, mixed, tokenizer, "mixed")


def test_import_refuses_mixture_of_experts_layers_and_interleaved_rope_in_one_line(tmp_path, seed):
    from minitx.data.tokenizer import CharTokenizer
    from minitx.hf.load import read_hf_directory

    tokenizer = CharTokenizer(TEXT)
    directory = export_model(tmp_path, mla_model(seed, tokenizer), tokenizer)
    path = directory / "config.json"
    hf = json.loads(path.read_text())
    for change, message in (
        (dict(first_k_dense_replace=1), r"first_k_dense_replace=1 makes layers 1\.\.1 mixture-of-experts"),
        (dict(rope_interleave=True), r"rope_interleave=true cannot be imported"),
    ):
        path.write_text(json.dumps({**hf, **change}))
        with pytest.raises(UserError, match=message) as error:
            read_hf_directory(str(directory), log=lambda _: None)
        assert "\n" not in str(error.value)
