"""Generation: cached decoding against full forward passes, cache memory, sampling, the command.

Models are tiny (block_size 16, window 5) with random, larger-than-usual weights so that logits
are far from ties and every part (MTA convolution, head mixing, gate) changes the result. Each
test draws a fresh seed (printed in the captured output of a failure); set MINITX_TEST_SEED to
replay one.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import bpe_tokenizer
from torch._dynamo.utils import counters

import minitx
from minitx import AttentionConfig, ModelConfig, Transformer, functional
from minitx.attention.diff import DifferentialAttention
from minitx.attention.mta import native
from minitx.attention.mta.layer import MultiTokenAttention
from minitx.data.tokenizer import CharTokenizer
from minitx.decoding.loop import CachedSteps, generate
from minitx.decoding.sampling import pick_next, top_k_filter, top_p_filter
from minitx.errors import UserError
from minitx.files.configs import merged
from minitx.generation.command import TextStream, main
from minitx.kinds import registry
from minitx.trained_model import load_checkpoint
from minitx.verify import cached_logits

pytestmark = pytest.mark.usefixtures("seed", "one_thread")

TOL = 1e-4
VOCAB, BLOCK, WINDOW = 13, 16, 5
REPO = Path(__file__).resolve().parents[2]


# -- tiny models ------------------------------------------------------------------------------------

MTA = dict(
    kind="mta", options={"mta": {"query_kernel": 3, "key_kernel": 3, "query_chunk": 4, "head_group": 2}}
)
KINDS = {
    "mha": dict(kind="mha"),
    "mqa": dict(kind="mqa"),
    "gqa": dict(kind="gqa", n_kv_head=2),
    "local": dict(kind="local", options={"local": {"window": WINDOW}}),
    "local_global": dict(kind="local", options={"local": {"window": WINDOW, "n_global": 2}}),
    "local_gqa": dict(kind="local", options={"local": {"window": WINDOW}}, n_kv_head=2),
    "mta_pre_gqa": merged(MTA, options={"mta": {"conv_placement": "pre"}}, n_kv_head=2),
    "mta_post": merged(MTA, options={"mta": {"conv_placement": "post"}}),
    # Layer 0 without convolution, layer 1 convolving along queries only: keys need no order.
    "mta_query_conv_one_layer": merged(
        MTA, options={"mta": {"key_kernel": 1, "conv_layers": [1], "head_mix": "pre"}}
    ),
    "mha_sinks_qknorm_gate": dict(
        kind="mha", options={"mha": {"sinks": True, "qk_norm": True, "gate": "head"}}
    ),
    "local_sinks_gqa": dict(kind="local", options={"local": {"window": WINDOW, "sinks": True}}, n_kv_head=2),
    "diff_gqa": dict(kind="diff", n_kv_head=2),
    "mixed_diff_local": dict(kind="diff", options={"local": {"window": WINDOW}}, layers=["diff", "local"]),
    "mixed_local_mha": dict(kind="local", options={"local": {"window": WINDOW}}, layers=["local", "mha"]),
    "mixed_mta_local_gqa": merged(
        MTA, options={"local": {"window": WINDOW}}, n_kv_head=2, layers=["mta", "local", "gqa"]
    ),
    "mla": dict(kind="mla", options={"mla": {"kv_lora_rank": 6, "qk_rope_head_dim": 4}}),
    "mixed_mla_q_latent_local": dict(
        kind="mla",
        layers=["mla", "local"],
        options={
            "mla": {"kv_lora_rank": 6, "qk_rope_head_dim": 2, "q_lora_rank": 5},
            "local": {"window": WINDOW},
        },
    ),
}


def make_model(
    attention: dict, n_layer: int = 2, positions: str = "rope", block_size: int = BLOCK
) -> Transformer:
    attention = copy.deepcopy(attention)
    if "mta" in attention.get("layers", [attention["kind"]]):  # by default convolving on every layer
        attention.setdefault("options", {}).setdefault("mta", {}).setdefault(
            "conv_layers", list(range(n_layer))
        )
    config = ModelConfig(
        vocab_size=VOCAB,
        block_size=block_size,
        n_layer=n_layer,
        n_head=4,
        d_model=16,
        positions=positions,
        attention=AttentionConfig(**attention),
    )
    model = Transformer(config)
    with torch.no_grad():  # random, not identity: every learned part matters, logits far from ties
        for name, param in model.named_parameters():
            if name.endswith(("mix_pre", "mix_post")):
                param.add_(0.3 * torch.randn_like(param))
            elif "norm" in name and "weight" in name:
                param.copy_(1 + 0.2 * torch.randn_like(param))
            else:
                param.copy_(0.4 * torch.randn_like(param))
    return model.eval()


def cropped_logits(model: Transformer, seq: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """The same positions, each from a fresh forward pass over the last block_size tokens."""
    block = model.config.block_size
    with torch.no_grad():
        return torch.stack(
            [model(seq[:, max(0, t - block) : t])[:, -1] for t in range(prompt_len, seq.shape[1] + 1)], dim=1
        )


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


# -- cached decoding equals the full forward pass -----------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_cached_logits_equal_full_forward_within_the_context(kind):
    model = make_model(KINDS[kind])
    for prompt_len in (1, WINDOW - 1, WINDOW + 3, BLOCK):
        seq = torch.randint(0, VOCAB, (2, BLOCK))
        with torch.no_grad():
            full = model(seq)[:, prompt_len - 1 :]
        assert max_diff(cached_logits(model, seq, prompt_len), full) < TOL, prompt_len


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_tokens_with_and_without_cache_agree(kind):
    model = make_model(KINDS[kind])
    prompt = torch.randint(0, VOCAB, (2, 2))
    with_cache = generate(model, prompt, BLOCK - 2, temperature=0)
    without = generate(model, prompt, BLOCK - 2, temperature=0, use_cache=False)
    assert with_cache.shape == (2, BLOCK)
    assert torch.equal(with_cache, without)
    assert torch.equal(with_cache[:, :2], prompt)


# -- compiled decoding --------------------------------------------------------------------------------

COMPILED = [(kind, "rope") for kind in KINDS] + [("mha", "learned"), ("mixed_mta_local_gqa", "learned")]


def compiled_greedy(model, compiled, new_tokens: int) -> int:
    """Asserts that the compiled model decodes the eager model's greedy tokens, for two prompt
    lengths, without a graph break; returns how many graphs dynamo made."""
    torch._dynamo.reset()
    counters.clear()
    for prompt_len in (3, 5):
        prompt = torch.randint(0, VOCAB, (2, prompt_len))
        want = generate(model, prompt, new_tokens, temperature=0)
        assert torch.equal(generate(compiled, prompt, new_tokens, temperature=0), want), prompt_len
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    graphs = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    return graphs


@pytest.mark.slow
@pytest.mark.parametrize("kind, positions", COMPILED, ids=[f"{k}-{p}" for k, p in COMPILED])
def test_compiled_decoding_equals_eager_from_a_few_graphs(kind, positions):
    """torch.compile(model) through generate, past the context (the rings wrap, RoPE slides, learned
    positions crop): the same tokens from a handful of graphs (prefill, step, crop), not one per
    position (3 * BLOCK here). Dynamo's own backend: recompiles and breaks are dynamo's doing."""
    model = make_model(KINDS[kind], positions=positions)
    assert compiled_greedy(model, torch.compile(model, backend="eager"), 3 * BLOCK) <= 6


@pytest.mark.slow
def test_compiled_mta_decoding_without_the_c_loops(monkeypatch):
    """MTA's torch path, which a GPU decodes with (the C loops are CPU only), compiled: the same
    tokens, no graph break, a handful of graphs."""
    monkeypatch.setattr(native, "available", lambda *_: False)
    monkeypatch.setattr(native, "library", lambda: pytest.fail("the C loops were called"))
    model = make_model(KINDS["mixed_mta_local_gqa"])
    assert compiled_greedy(model, torch.compile(model, backend="eager"), 3 * BLOCK) <= 6


@pytest.mark.slow
def test_compiled_decoding_through_inductor_equals_eager():
    """The code inductor generates (a dynamic position, a growing cache) decodes the same tokens;
    inductor specialises each ring a little more (whether the slot written is its first): a mix of
    three kinds makes 10 graphs, within decoding's recompile limit (COMPILED_DECODING)."""
    model = make_model(KINDS["mixed_mta_local_gqa"])
    assert compiled_greedy(model, torch.compile(model), 4 * BLOCK) <= 12


# Local attention with global tokens is left out: past block_size its globals stay the sequence's
# first tokens (attention sinks), while a crop makes its own first tokens global.
SLIDING = [kind for kind in KINDS if kind != "local_global"]


@pytest.mark.parametrize("kind", SLIDING)
def test_one_layer_rope_model_slides_exactly_like_the_crop(kind):
    # One layer of the first kind, with only the options that kind reads.
    attention = dict(KINDS[kind])
    first = attention.pop("layers", [attention["kind"]])[0]
    options = dict((attention.get("options") or {}).get(first) or {})
    options.pop("conv_layers", None)  # the one layer is layer 0: make_model convolves it
    one = {"kind": first, "options": {first: options}}
    if registry[first].reads_n_kv_head:
        one["n_kv_head"] = attention.get("n_kv_head")
    model = make_model(one, n_layer=1)
    seq = torch.randint(0, VOCAB, (1, BLOCK + 12))
    for prompt_len in (3, BLOCK + 4):  # generating past block_size, and a prompt longer than it
        assert (
            max_diff(cached_logits(model, seq, prompt_len), cropped_logits(model, seq, prompt_len)) < TOL
        ), prompt_len
    prompt = seq[:, :3]
    assert torch.equal(
        generate(model, prompt, BLOCK + 4, temperature=0),
        generate(model, prompt, BLOCK + 4, temperature=0, use_cache=False),
    )


def sliding_reference(model: Transformer, seq: torch.Tensor) -> torch.Tensor:
    """Logits of every position when each layer attends only to the last block_size positions.

    That is what the cache computes past block_size in a deep model: a copy of the model whose
    context is the whole sequence, each layer's attention replaced by the materialised oracle
    with a window (MTA: one query row at a time, seeing keys of its own window only).
    """
    block, L = model.config.block_size, seq.shape[1]
    config = ModelConfig.from_dict({**model.config.to_dict(), "block_size": L})
    reference = Transformer(config).eval()
    reference.load_state_dict(model.state_dict())
    for layer in reference.blocks:
        attn = layer.attn
        window = min(getattr(attn, "window", block), block)
        n_global = min(getattr(attn, "n_global", 0), block)
        if isinstance(attn, MultiTokenAttention):
            attn.attend = lambda q, k, v, attn=attn: mta_sliding(attn, q, k, v, block)
        elif isinstance(attn, DifferentialAttention):  # both maps over the last block_size keys
            attn.attend = lambda q, k, v, attn=attn, w=window: attn.differential(
                q,
                k,
                v,
                mask=functional.allowed_mask(torch.arange(L), torch.arange(L), window=w),
                causal=False,
            )
        else:
            attn.attend = lambda q, k, v, w=window, g=n_global, attn=attn: functional.attention(
                q, k, v, window=w, n_global=g, sinks=getattr(attn, "sinks", None)
            )
    with torch.no_grad():
        return reference(seq)


def mta_sliding(attn: MultiTokenAttention, q, k, v, block: int):
    T, n_hist = q.shape[2], attn.c_q - 1
    positions = torch.arange(T)
    padded_q = torch.nn.functional.pad(q, (0, 0, n_hist, 0))
    padded_pos = torch.cat([torch.full((n_hist,), -1), positions])
    outs = [
        attn.rows(
            padded_q[:, :, i : i + n_hist + 1],
            k[:, :, : i + 1],
            v[:, :, : i + 1],
            padded_pos[i : i + n_hist + 1],
            positions[: i + 1],
            first_key=i - block + 1,
        )[0]
        for i in range(T)
    ]
    return torch.cat(outs, dim=2)


@pytest.mark.parametrize("kind", KINDS)
def test_deep_rope_model_past_the_context_is_sliding_window_attention(kind):
    model = make_model(KINDS[kind], n_layer=3 if "layers" in KINDS[kind] else 2)
    seq = torch.randint(0, VOCAB, (2, BLOCK + 10))
    expected = sliding_reference(model, seq)
    for prompt_len in (2, BLOCK + 5):
        assert max_diff(cached_logits(model, seq, prompt_len), expected[:, prompt_len - 1 :]) < TOL, (
            prompt_len
        )
    # Within the context the reference is the plain model. Past it the crop differs, unless every
    # layer is local without globals: then n_layer windows of 5 reach back less than block_size.
    with torch.no_grad():
        assert max_diff(expected[:, :BLOCK], model(seq[:, :BLOCK])) < TOL
    crop_diff = max_diff(cropped_logits(model, seq, BLOCK + 5), expected[:, BLOCK + 4 :])
    if (
        set(model.config.layer_kinds) == {"local"}
        and model.config.attention.options_of("local").n_global == 0
    ):
        assert crop_diff < TOL
    else:
        assert crop_diff > 1e-3


@pytest.mark.parametrize("kind", ["mha", "local_global", "mta_pre_gqa"])
def test_learned_positions_past_the_context_equal_the_crop(kind):
    model = make_model(KINDS[kind], positions="learned")
    seq = torch.randint(0, VOCAB, (2, BLOCK + 9))
    for prompt_len in (1, BLOCK):
        assert (
            max_diff(cached_logits(model, seq, prompt_len), cropped_logits(model, seq, prompt_len)) < TOL
        ), prompt_len
    prompt = seq[:, :4]
    assert torch.equal(
        generate(model, prompt, BLOCK, temperature=0),
        generate(model, prompt, BLOCK, temperature=0, use_cache=False),
    )


def test_learned_positions_refuse_a_prompt_longer_than_the_context():
    model = make_model(KINDS["mha"], positions="learned")
    with pytest.raises(
        UserError,
        match=f"prompt has {BLOCK + 1} tokens .*block_size={BLOCK}.*cannot slide; shorten the prompt",
    ):
        generate(model, torch.zeros(1, BLOCK + 1, dtype=torch.long), 1)
    assert generate(model, torch.zeros(1, BLOCK + 1, dtype=torch.long), 2, use_cache=False).shape == (
        1,
        BLOCK + 3,
    )


def test_generate_restores_training_mode_and_model_method_delegates():
    model = make_model(KINDS["gqa"]).train()
    prompt = torch.randint(0, VOCAB, (1, 3))
    out = model.generate(prompt, 5, temperature=0, top_k=None, top_p=None, use_cache=True)
    assert model.training
    assert torch.equal(out, generate(model, prompt, 5, temperature=0))
    assert torch.equal(generate(model, prompt, 0), prompt)


def test_model_still_trains_after_generating():
    # Generation runs in inference mode; what it caches for later (local attention's block masks,
    # the RoPE table grown past block_size) must stay usable by autograd.
    torch.manual_seed(0)
    model = make_model(KINDS["mixed_local_mha"])
    prompt = torch.randint(0, VOCAB, (2, BLOCK))  # longer than the window: the chunked path builds a mask
    generate(model, prompt, 2 * BLOCK)  # past block_size: the RoPE table grows
    assert model.rope.cos.shape[0] > BLOCK and not model.rope.cos.is_inference()
    model.train()
    logits = model(prompt)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), prompt.flatten()).backward()
    assert all(p.grad is not None for p in model.parameters())


# -- cache memory -----------------------------------------------------------------------------------


def cache_bytes(attention: dict, length: int) -> int:
    """fp32 cache bytes for a batch of 3, length tokens, 2 layers of 4 heads of dimension 4."""
    config = ModelConfig(
        vocab_size=VOCAB,
        block_size=64,
        n_layer=2,
        n_head=4,
        d_model=16,
        attention=AttentionConfig(**attention),
    )
    allocated = Transformer(config).new_cache(batch=3, max_len=length).nbytes()
    assert allocated == minitx.kv_cache_bytes(config, length, batch=3)  # the formula is what is allocated
    return allocated


def test_cache_bytes_shrink_with_kv_heads_and_stay_flat_for_local():
    mha = cache_bytes(dict(kind="mha"), 40)
    assert mha == 2 * 2 * 3 * 4 * 40 * 4 * 4  # layers x (k, v) x batch x heads x tokens x head_dim x fp32
    assert cache_bytes(dict(kind="mqa"), 40) * 4 == mha  # 1 / n_head
    assert cache_bytes(dict(kind="gqa", n_kv_head=2), 40) * 2 == mha  # n_kv_head / n_head
    assert cache_bytes(dict(kind="mha"), 200) == cache_bytes(
        dict(kind="mha"), 64
    )  # past block_size it slides
    # MTA also keeps its last c_q - 1 = 2 queries (4 heads) per layer.
    assert (
        cache_bytes(merged(MTA, options={"mta": {"conv_layers": [0, 1]}}), 40) == mha + 2 * 3 * 4 * 2 * 4 * 4
    )
    # Local: memory grows up to window + n_global tokens, then not at all, for 10x the window.
    local = dict(kind="local", options={"local": {"window": 8, "n_global": 2}})
    assert cache_bytes(local, 5) < cache_bytes(local, 10) == cache_bytes(local, 80)
    assert cache_bytes(local, 80) == 2 * 2 * 3 * 4 * 10 * 4 * 4


def test_local_cache_stays_flat_while_generating_ten_windows():
    model = make_model(KINDS["local_global"], block_size=64)
    steps = CachedSteps(model, 1, 10 * WINDOW)
    before = steps.cache.nbytes()
    seq = torch.randint(0, VOCAB, (1, 10 * WINDOW))
    with torch.no_grad():
        steps.prefill(seq[:, :1])
        for t in range(2, seq.shape[1] + 1):
            steps.step(seq[:, :t])
    assert steps.cache.nbytes() == before == minitx.kv_cache_bytes(model.config, 10 * WINDOW)
    assert all(layer.k.shape[2] == WINDOW + 2 for layer in steps.cache.layers)


def test_cache_sized_for_a_short_generation_refuses_to_overflow():
    model = make_model(KINDS["mha"])
    cache = model.new_cache(1, max_len=4)
    with torch.no_grad():
        model(torch.zeros(1, 4, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="larger max_len"):
            model(torch.zeros(1, 1, dtype=torch.long), cache=cache)


# -- sampling ---------------------------------------------------------------------------------------


def test_top_k_filter_keeps_the_k_largest():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, -2.0]])
    kept = top_k_filter(logits, 2)
    assert torch.equal(torch.isfinite(kept), torch.tensor([[False, True, False, True, False]]))
    assert torch.equal(kept[torch.isfinite(kept)], torch.tensor([5.0, 4.0]))
    assert torch.equal(top_k_filter(logits, 9), logits)


def test_top_p_filter_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.05, 0.5, 0.3, 0.15]])  # sorted: 0.5, 0.3 (0.8), 0.15 (0.95), 0.05
    logits = probs.log()
    kept = lambda p: torch.isfinite(top_p_filter(logits, p))[0].tolist()  # noqa: E731
    assert kept(0.5) == [False, True, False, False]  # the top token alone reaches 0.5
    assert kept(0.6) == [False, True, True, False]
    assert kept(0.79) == [False, True, True, False]
    assert kept(0.81) == [False, True, True, True]
    assert kept(0.01) == [False, True, False, False]  # the most likely token always stays
    assert kept(1.0) == [True, True, True, True]
    # Sampling never draws what the filter removed.
    draws = torch.stack([pick_next(logits, 1.0, top_p=0.6) for _ in range(300)])
    assert set(draws.flatten().tolist()) == {1, 2}


def test_top_k_one_is_greedy_and_a_seed_reproduces_a_sample():
    model = make_model(KINDS["mha"])
    prompt = torch.randint(0, VOCAB, (3, 2))
    greedy = generate(model, prompt, 12, temperature=0)
    assert torch.equal(generate(model, prompt, 12, temperature=1.5, top_k=1), greedy)

    def sample(seed: int, **options) -> torch.Tensor:
        return generate(
            model, prompt, 12, temperature=1.0, generator=torch.Generator().manual_seed(seed), **options
        )

    assert torch.equal(sample(7), sample(7))
    assert torch.equal(sample(7, top_p=0.9, top_k=5), sample(7, top_p=0.9, top_k=5))
    assert not torch.equal(sample(7), sample(8))


def test_eos_stops_generation_and_pads_finished_rows():
    model = make_model(KINDS["mha"])
    prompt = torch.randint(0, VOCAB, (2, 3))
    greedy = generate(model, prompt, 10, temperature=0)
    eos = greedy[0, 5].item()  # row 0 makes it by step 3 at the latest
    seen = []
    out = generate(model, prompt, 10, temperature=0, eos_id=eos, on_token=lambda t: seen.append(t.clone()))
    expected, ends = greedy.clone(), []
    for row in range(2):
        made = greedy[row, 3:].tolist()
        end = 3 + made.index(eos) + 1 if eos in made else greedy.shape[1]
        expected[row, end:] = eos  # a finished row only repeats eos
        ends.append(end)
    assert torch.equal(out, expected[:, : max(ends)])  # stops once every row has finished
    assert len(seen) == out.shape[1] - 3 and torch.equal(torch.stack(seen, dim=1), out[:, 3:])


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(max_new_tokens=-1), "max_new_tokens: is -1; use 0 or more"),
        (dict(temperature=-0.5), "temperature: is -0.5"),
        (dict(top_p=0.0), "top_p: is 0.0"),
        (dict(top_p=1.5), "top_p: is 1.5"),
        (dict(top_k=0), "top_k: is 0; use 1 or more"),
    ],
)
def test_bad_sampling_options_are_user_errors(options, message):
    model = make_model(KINDS["mha"])
    kwargs = dict(max_new_tokens=3) | options
    with pytest.raises(UserError, match=message):
        generate(model, torch.zeros(1, 2, dtype=torch.long), **kwargs)


# -- checkpoints and the command ------------------------------------------------------------------

TEXT = "to be or not to be, that is the question.\n"


def write_checkpoint(path: Path, attention: dict | None = None, positions: str = "rope") -> Path:
    """A checkpoint in the training format: Lightning's state_dict with "model." keys plus "minitx"."""
    tokenizer = CharTokenizer(TEXT)
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size,
        block_size=32,
        n_layer=2,
        n_head=2,
        d_model=16,
        positions=positions,
        attention=AttentionConfig(**(attention or {})),
    )
    model = Transformer(config)
    checkpoint = {
        "state_dict": {f"model.{key}": value for key, value in model.state_dict().items()},
        "minitx": {"format": 1, "model_config": config.to_dict(), "tokenizer": tokenizer.to_dict()},
        "global_step": 0,
    }
    torch.save(checkpoint, path)
    return path


def test_load_checkpoint_round_trip(tmp_path):
    path = write_checkpoint(tmp_path / "a.ckpt", attention=dict(kind="gqa", n_kv_head=1))
    model, tokenizer, raw = load_checkpoint(str(path))
    assert not model.training and model.config.layer_kinds == ["gqa", "gqa"]
    assert tokenizer.decode(tokenizer.encode("to be")) == "to be"
    expected = {key[len("model.") :]: value for key, value in raw["state_dict"].items()}
    assert all(torch.equal(value, expected[key]) for key, value in model.state_dict().items())


def test_loading_a_checkpoint_needs_no_lightning():
    # Generation reads checkpoints through minitx.trained_model, which must stay free of Lightning.
    code = "import sys, minitx.generation.command, minitx.trained_model; sys.exit('lightning' in sys.modules)"
    assert (
        subprocess.run(
            [sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120
        ).returncode
        == 0
    )


def test_command_streams_a_continuation(tmp_path, capsys):
    path = write_checkpoint(tmp_path / "a.ckpt")
    main(
        [
            "--ckpt",
            str(path),
            "--prompt",
            "to be",
            "--max-new-tokens",
            "30",
            "--seed",
            "1",
            "--num-samples",
            "2",
        ]
    )
    out = capsys.readouterr().out
    samples = out.split("---------------\n")
    assert len(samples) == 2
    for sample in samples:
        assert sample.startswith("to be") and len(sample) == len("to be") + 30 + 1
        assert set(sample) <= set(TEXT)
    assert samples[0] != samples[1]


def test_command_streams_token_by_token(tmp_path, monkeypatch):
    path = write_checkpoint(tmp_path / "a.ckpt")
    writes = []
    monkeypatch.setattr(
        sys,
        "stdout",
        type("Out", (), {"write": lambda self, s: writes.append(s), "flush": lambda self: None})(),
    )
    main(["--ckpt", str(path), "--prompt", "be", "--max-new-tokens", "7", "--temperature", "0"])
    assert writes[0] == "be"
    assert [len(w) for w in writes[1:8]] == [1] * 7  # one character per token, as each is made


def config_attention(name: str) -> dict:
    return yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())["model"]["attention"]


# Each variant's config file's attention: the text runs past the 32-token context.
COMMAND_CASES = {
    "local_mqa": lambda: dict(kind="local", options={"local": {"window": 4}}, n_kv_head=1),
    "local_sinks_gated": lambda: dict(
        kind="local", options={"local": {"window": 4, "sinks": True, "gate": "head"}}
    ),
    **{
        name: functools.partial(config_attention, name)
        for name in ("mla", "diff", "qknorm", "sinks", "gated")
    },
}


@pytest.mark.parametrize("case", COMMAND_CASES)
def test_command_greedy_is_deterministic_and_matches_no_cache(tmp_path, capsys, case):
    path = write_checkpoint(tmp_path / "a.ckpt", attention=COMMAND_CASES[case]())
    if "sinks" in case:  # sinks start at zero: move them, so a cache that drops them would show
        checkpoint = torch.load(path, weights_only=True)
        for key, value in checkpoint["state_dict"].items():
            if key.endswith("sinks"):
                value.normal_()
        torch.save(checkpoint, path)
    # Within the context the cache changes nothing; past it (32 tokens) the cache slides while
    # --no-cache crops, which agree exactly only where each layer's window is short (local_mqa).
    new = 40 if case == "local_mqa" else 25
    args = ["--ckpt", str(path), "--prompt", "or not", "--max-new-tokens", str(new), "--temperature", "0"]
    outputs = []
    for extra in ([], [], ["--no-cache"]):
        main(args + extra)
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] == outputs[2]
    assert outputs[0].startswith("or not") and len(outputs[0]) == len("or not") + new + 1


@pytest.mark.slow  # a torch.compile of the decoding loop: about 4 s
def test_command_compile_decodes_through_torch_compile(tmp_path, capsys, monkeypatch):
    """--compile hands generate a torch.compile'd model (dynamo's own backend here, to keep the test
    short; inductor is tested above) and prints the text the eager model does."""
    path = write_checkpoint(
        tmp_path / "a.ckpt", attention=dict(kind="mta", options={"mta": {"conv_layers": [0, 1]}})
    )
    args = ["--ckpt", str(path), "--prompt", "or not", "--max-new-tokens", "40", "--temperature", "0"]
    compiled = []

    def compile_with_dynamo(model, **options):
        compiled.append(model)
        return real_compile(model, backend="eager", **options)

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", compile_with_dynamo)
    outputs = []
    for extra in ([], ["--compile"]):
        main(args + extra)
        outputs.append(capsys.readouterr().out)
    torch._dynamo.reset()
    assert len(compiled) == 1 and isinstance(compiled[0], Transformer)
    assert outputs[0] == outputs[1]


@functools.lru_cache(maxsize=1)
def test_text_stream_holds_back_a_character_split_across_tokens():
    tokenizer = bpe_tokenizer()
    ids = tokenizer.encode("a€b")  # "€" is unseen in training: three one-byte tokens
    assert len(ids) == 5
    writes = []
    out = type("Out", (), {"write": lambda self, text: writes.append(text), "flush": lambda self: None})()
    stream = TextStream(tokenizer, ids[:1], out)
    for token in ids[1:]:
        stream.add(token)
    stream.finish()
    assert writes == ["€", "b", "\n"]


def test_command_with_bpe_streams_whole_characters_and_stops_at_eos(tmp_path, capsys):
    tokenizer = bpe_tokenizer()
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size, block_size=32, n_layer=1, n_head=2, d_model=16, tie_embeddings=False
    )
    model = Transformer(config).eval()
    with torch.no_grad():  # make the end-of-text token likely, so that generation can stop early
        model.lm_head.weight[tokenizer.eos_id].mul_(50)
    torch.save(
        {
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "minitx": {"format": 1, "model_config": config.to_dict(), "tokenizer": tokenizer.to_dict()},
        },
        tmp_path / "bpe.ckpt",
    )
    prompt = tokenizer.encode("ça")

    def sample(seed: int) -> list[int]:
        return generate(
            model,
            torch.tensor([prompt]),
            40,
            temperature=2.0,
            generator=torch.Generator().manual_seed(seed),
            eos_id=tokenizer.eos_id,
        )[0].tolist()

    # A seed whose sample stops at eos after a few tokens (temperature 2: many split characters).
    seed = next(seed for seed in range(50) if len(prompt) + 5 < len(sample(seed)) < len(prompt) + 40)
    made = sample(seed)[len(prompt) : -1]
    assert tokenizer.eos_id not in made
    main(
        [
            "--ckpt",
            str(tmp_path / "bpe.ckpt"),
            "--prompt",
            "ça",
            "--max-new-tokens",
            "40",
            "--seed",
            str(seed),
            "--temperature",
            "2",
        ]
    )
    assert capsys.readouterr().out == "ça" + tokenizer.decode(prompt + made)[len("ça") :] + "\n"


def bad_inputs(tmp_path: Path) -> list[tuple[list[str], str]]:
    good = write_checkpoint(tmp_path / "good.ckpt")
    learned = write_checkpoint(tmp_path / "learned.ckpt", positions="learned")
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[:3000])
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(os.urandom(2000))
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"weights": torch.zeros(2)}, foreign)
    other_shape = tmp_path / "other_shape.ckpt"
    ckpt = torch.load(good, weights_only=True)
    ckpt["minitx"]["model_config"]["d_model"] = 32
    torch.save(ckpt, other_shape)
    newer = tmp_path / "newer.ckpt"
    ckpt["minitx"]["format"] = 2
    torch.save(ckpt, newer)
    g = ["--ckpt", str(good)]
    return [
        (["--ckpt", str(tmp_path / "missing.ckpt")], "no such file"),
        (["--ckpt", str(tmp_path)], "is a directory"),
        (["--ckpt", str(truncated)], "not a readable minitx checkpoint"),
        (["--ckpt", str(garbage)], "not a readable minitx checkpoint"),
        (["--ckpt", str(foreign)], "not a minitx checkpoint"),
        (["--ckpt", str(other_shape)], "weights do not match its model config"),
        (["--ckpt", str(newer)], "checkpoint format 2 is not supported"),
        (g + ["--prompt", "xyz!"], "characters the tokenizer does not know: '!', 'x', 'y', 'z'"),
        (
            ["--ckpt", str(learned), "--prompt", "to be " * 6],
            "prompt has 36 tokens .*block_size=32.*shorten the prompt",
        ),
        (g + ["--prompt-file", str(tmp_path / "nope.txt")], "--prompt-file .*: no such file"),
        (g + ["--max-new-tokens", "-3"], "--max-new-tokens: is -3"),
        (g + ["--temperature", "-1"], "--temperature: is -1"),
        (g + ["--top-p", "1.5"], "--top-p: is 1.5"),
        (g + ["--top-k", "0"], "--top-k: is 0"),
        (g + ["--num-samples", "0"], "--num-samples: is 0"),
        (g + ["--device", "nonsense"], "--device nonsense: not usable here"),
    ]


def test_bad_inputs_are_one_line_errors(tmp_path, capsys):
    from minitx.cli import generate_main

    for argv, message in bad_inputs(tmp_path):
        assert generate_main(argv) == 2, argv
        captured = capsys.readouterr()
        err = captured.err.strip()
        assert "\n" not in err and "Traceback" not in err, err
        assert err.startswith("generate: error: ") and __import__("re").search(message, err), (message, err)


def test_bad_input_through_the_real_command_exits_2(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, str(REPO / "generate.py"), "--ckpt", str(tmp_path / "missing.ckpt")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0 and "no such file" in result.stderr


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--prompt", "x"], "the following arguments are required: --ckpt"),
        (["--ckpt", "x.ckpt", "--top-k", "abc"], "argument --top-k: invalid int value: 'abc'"),
        (["--ckpt", "x.ckpt", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ],
)
def test_command_line_usage_errors_are_one_line_and_exit_2(argv, message, capsys):
    from minitx.cli import generate_main

    assert generate_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"generate: error: {message}; see --help"


@pytest.mark.skipif(
    importlib.util.find_spec("minitx.training") is None, reason="minitx.training is not written yet"
)
@pytest.mark.slow  # 9-24 s of real runs: the fast suite within its minutes (issue 62)
def test_checkpoint_from_a_real_training_run(tmp_path, capsys):
    """A few steps of the real train command on the built-in Shakespeare, then generate from it."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    train = [
        sys.executable,
        str(REPO / "train.py"),
        "--config",
        str(REPO / "configs" / "default.yaml"),
        "--trainer.max_steps",
        "2",
        "--trainer.val_check_interval",
        "2",
        "--data.val_batches",
        "1",
        "--data.batch_size",
        "2",
        "--model.n_layer",
        "1",
        "--model.d_model",
        "16",
        "--model.n_head",
        "2",
        "--model.block_size",
        "16",
        "--run.root",
        str(tmp_path),
        "--run.name",
        "tiny",
        "--run.sample_tokens",
        "0",
        "--trainer.enable_progress_bar",
        "false",
    ]
    result = subprocess.run(train, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    ckpt = tmp_path / "tiny" / "checkpoints" / "last.ckpt"
    model, tokenizer, _ = load_checkpoint(str(ckpt))
    assert model.config.block_size == 16 and model.config.vocab_size >= tokenizer.vocab_size
    args = ["--ckpt", str(ckpt), "--prompt", "ROMEO:", "--max-new-tokens", "24", "--temperature", "0"]
    main(args)
    with_cache = capsys.readouterr().out
    main(args + ["--no-cache"])
    assert with_cache.startswith("ROMEO:") and len(with_cache) >= len("ROMEO:") + 1
    assert capsys.readouterr().out == with_cache
