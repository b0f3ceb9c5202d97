"""The diagnostics (minitx/evaluation/diagnostics.py) on constructed inputs whose answers the
definitions give, then on tiny models of every kind, and through `evaluate.py --diagnostics`.

Known answers: uniform causal weights have normalised entropy 1 and alpha_1 = H_T / T (H_T the
harmonic number: key 0 gets 1/(i + 1) from query i); all weight on key 0 is a sink in every head
(sink rate 1) and a first-token share of 1; one 1e4 among N(0, 1) values is 1e4 over the median
of |N(0, 1)|, 0.674.
"""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from helpers import assert_figures_close
from test_evaluation import WORDS, write_checkpoint

from minitx import AttentionConfig, ModelConfig, Transformer, kinds
from minitx.cli import eval_main
from minitx.evaluation import diagnostics
from minitx.evaluation.diagnostics import (
    MassiveStats,
    held_out_sequences,
    loss_by_position,
    run_diagnostics,
    validation_sequences,
)
from minitx.files.configs import REPO_ROOT
from minitx.functional import allowed_mask
from minitx.trained_model import load_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

T = 12
KEYS = {
    "first_token_share",
    "sink_rate",
    "massive_ratio",
    "massive",
    "entropy",
    "entropy_by_layer",
    "entropy_missing",
    "loss_by_position",
    "n_sequences",
    "seq_len",
}
KINDS = {
    "mha": dict(kind="mha"),
    "gqa": dict(kind="gqa", n_kv_head=2),
    "local": dict(kind="local", options={"local": {"window": 3, "n_global": 1}}),
    "mta": dict(kind="mta", options={"mta": {"query_kernel": 2, "key_kernel": 3, "conv_layers": [0]}}),
    "mla": dict(kind="mla", options={"mla": {"kv_lora_rank": 8, "qk_rope_head_dim": 4}}),
    "diff": dict(kind="diff"),
    "sinks": dict(kind="mha", options={"mha": {"sinks": True, "qk_norm": True, "gate": "head"}}),
    "mixed": dict(kind="mha", layers=["mha", "local", "diff"], options={"local": {"window": 4}}),
    "custom": dict(kind="ssmax", kind_modules=["examples/custom_attention.py"]),
    # gdn has no softmax map: its layers give no share, alpha_1 or entropy; the hybrid's mha does.
    "gdn": dict(kind="gdn", options={"gdn": {"chunk_size": 5}}),
    "hybrid": dict(layers=["gdn", "gdn", "gdn", "mha"], options={"gdn": {"chunk_size": 5}}),
}


def harmonic(n: int) -> float:
    return sum(1 / i for i in range(1, n + 1))


def uniform_causal(B: int = 2, H: int = 3, T: int = T) -> torch.Tensor:
    causal = torch.ones(T, T).tril()
    return (causal / causal.sum(-1, keepdim=True)).expand(B, H, T, T)


def all_on_key_zero(B: int = 2, H: int = 3, T: int = T) -> torch.Tensor:
    maps = torch.zeros(B, H, T, T)
    maps[..., 0] = 1.0
    return maps


def tiny_model(name: str, monkeypatch) -> Transformer:
    attention = KINDS[name]
    if attention.get("kind_modules"):
        monkeypatch.chdir(REPO_ROOT)  # the example's path is relative to the repo root
        kinds.import_kind_modules(attention["kind_modules"])
    n_layer = len(attention.get("layers") or [0, 0])
    config = ModelConfig(
        vocab_size=11,
        block_size=16,
        n_layer=n_layer,
        n_head=4,
        d_model=32,
        attention=AttentionConfig(**attention),
    )
    model = Transformer(config)
    with torch.no_grad():  # wide weights: maps far from uniform, so a mixed-up head or row shows
        for param in model.parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.3)
    return model.eval()


# ------------------------------------------------------------------------------- known answers


def map_figures(maps, visible=None, epsilon: float = diagnostics.EPSILON) -> dict:
    """The sink and entropy figures of one batch of maps, one entry per layer: a (B, H, T, T) map
    or a list of a layer's maps (a single map is one layer); the keys `visible` (T, T), one for
    all layers or a list, one per layer: causal unless given."""
    layers = [
        [m] if isinstance(m, torch.Tensor) else m
        for m in ([maps] if isinstance(maps, torch.Tensor) else maps)
    ]
    if not isinstance(visible, list):
        T = next(m for layer in layers for m in layer).shape[-1]
        visible = [torch.ones(T, T, dtype=torch.bool).tril() if visible is None else visible] * len(layers)
    batch = diagnostics.Probed(max(m[0].shape[0] for m in layers if m), layers, visible, None, None, [])
    sinks, entropy = diagnostics.SinkFigures(epsilon), diagnostics.EntropyFigures()
    sinks.add(batch)
    entropy.add(batch)
    return {**sinks.result(), **entropy.result()}


def sinks_past(maps, alpha: float, visible=None) -> tuple[float, float]:
    """The sink rate of maps at thresholds just under and just over alpha: (1, 0) when every
    head's alpha_1 is alpha."""
    return tuple(map_figures(maps, visible, epsilon=alpha + d)["sink_rate"] for d in (-1e-3, 1e-3))


def massive(hidden: torch.Tensor) -> dict:
    stats = MassiveStats()
    stats.add(hidden)
    return stats.result()


def test_uniform_causal_weights_have_entropy_one_and_alpha_one_the_harmonic_mean():
    for length in (2, 5, T):
        maps = uniform_causal(T=length)
        figures = map_figures([maps, [maps, maps]])
        assert figures["entropy"] == pytest.approx(1.0, abs=1e-6)
        assert figures["entropy_by_layer"] == pytest.approx([1.0, 1.0], abs=1e-6)
        expected = harmonic(length) / length
        assert figures["first_token_share"] == pytest.approx(expected, rel=1e-6)
        assert sinks_past(maps, expected) == (1.0, 0.0)


def test_a_window_normalises_by_the_keys_it_holds_and_alpha_by_the_queries_that_see_key_zero():
    window = 3
    positions = torch.arange(T)
    visible = allowed_mask(positions, positions, window=window)
    maps = (visible / visible.sum(-1, keepdim=True)).expand(2, 3, T, T)
    assert map_figures(maps, visible)["entropy"] == pytest.approx(1.0, abs=1e-6)
    assert map_figures(maps)["entropy"] < 0.9  # against every earlier key it is far from uniform
    # key 0 is seen by queries 0, 1, 2, which give it 1, 1/2, 1/3
    assert sinks_past(maps, harmonic(window) / window, visible) == (1.0, 0.0)


def test_all_weight_on_key_zero_is_a_sink_in_every_head_and_all_of_the_first_token_share():
    figures = map_figures(all_on_key_zero())
    assert figures["sink_rate"] == 1.0 and figures["first_token_share"] == 1.0
    assert figures["entropy"] == 0.0
    # one head of two layers' four uniform: a quarter of the (layer, head) pairs are sinks
    mixed = uniform_causal(H=2).clone()
    mixed[:, 0] = all_on_key_zero(H=1)[:, 0]
    figures = map_figures([mixed, uniform_causal(H=2)])
    assert figures["sink_rate"] == 0.25
    assert figures["first_token_share"] == pytest.approx(((1 + harmonic(T) / T) / 2 + harmonic(T) / T) / 2)


def test_one_planted_massive_activation_gives_its_ratio_position_and_channel():
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 64, 128, generator=generator)
    hidden[1, 5, 17] = -1e4  # the size counts, not the sign
    quiet = torch.randn(3, 64, 128, generator=generator)
    planted, plain = massive(hidden), massive(quiet)
    assert planted["ratio"] == pytest.approx(1e4 / 0.6745, rel=0.03)
    assert (planted["position"], planted["channel"], planted["max"]) == (5, 17, 1e4)
    assert plain["ratio"] < 10


# -------------------------------------------------------------------------------- on a model


def test_differential_attention_gives_its_two_softmax_maps(monkeypatch):
    model = tiny_model("diff", monkeypatch)
    layer = model.blocks[0].attn
    x = torch.randn(2, T, 32)
    first, second = layer.softmax_maps(x)
    assert first.shape == second.shape == (2, 2, T, T)  # H/2 heads each
    for maps in (first, second):
        assert torch.allclose(maps.sum(-1), torch.ones(2, 2, T), atol=1e-5)
    combined = layer.attention_weights(x)  # the map `reference` gives: A1 - lambda A2
    assert torch.allclose(first - layer.lambda_full() * second, combined, atol=1e-6)


@pytest.mark.parametrize("name", ["mha", "local", "diff"])
def test_each_kind_says_which_keys_its_maps_spread_over(name, monkeypatch):
    model = tiny_model(name, monkeypatch)
    x = torch.randn(2, T, 32)
    for block in model.blocks:
        support = torch.stack(block.attn.softmax_maps(x)).ne(0).any(dim=(0, 1, 2))
        assert torch.equal(support, block.attn.visible_keys(T))


@pytest.mark.parametrize("name", list(KINDS))
def test_run_diagnostics_on_every_kind(name, monkeypatch):
    model = tiny_model(name, monkeypatch)
    tokens = torch.randint(0, 11, (5, T))
    figures = run_diagnostics(model, tokens)
    assert set(figures) == KEYS
    json.dumps(figures, allow_nan=False)  # JSON-able, every figure finite
    n_layer = len(model.blocks)
    assert len(figures["massive"]) == len(figures["entropy_by_layer"]) == n_layer
    assert len(figures["loss_by_position"]) == T - 1
    assert (figures["n_sequences"], figures["seq_len"]) == (5, T)
    softmax = [kind != "gdn" for kind in model.config.layer_kinds]  # gdn: no softmax map
    assert all(e is None for e, s in zip(figures["entropy_by_layer"], softmax) if not s)
    if not any(softmax):
        assert figures["first_token_share"] is figures["sink_rate"] is figures["entropy"] is None
    else:
        assert 0 <= figures["sink_rate"] <= 1
    if name not in ("mta", "gdn"):  # MTA's maps are mixed after the softmax (weights below 0 are possible)
        assert 0 < figures["first_token_share"] <= 1
        assert all(0 < e <= 1 + 1e-6 for e, s in zip(figures["entropy_by_layer"], softmax) if s)
    assert figures["massive_ratio"] == max(entry["ratio"] for entry in figures["massive"]) > 1
    # the layers ran as the model's forward runs them
    assert figures["loss_by_position"] == pytest.approx(loss_by_position(model, tokens), abs=1e-5)


@pytest.mark.parametrize("name", ["mixed", "hybrid"])
def test_run_diagnostics_reads_each_layers_maps_and_output_and_does_not_depend_on_batching(name, monkeypatch):
    model = tiny_model(name, monkeypatch)
    tokens = torch.randint(0, 11, (5, T))
    whole = run_diagnostics(model, tokens)
    with torch.no_grad():
        x, rope = model.embed(tokens), model.rope(0, T)
        maps, visible, hidden = [], [], []
        for block in model.blocks:
            maps.append(block.attn.softmax_maps(block.norm1(x), rope))
            visible.append(block.attn.visible_keys(T))
            x = block(x, rope)
            hidden.append(x)
    of_maps = map_figures(maps, visible)
    for key in ("first_token_share", "sink_rate", "entropy", "entropy_by_layer"):
        assert_figures_close(whole[key], of_maps[key], rel=1e-5, what=key)
    # a gdn layer has no softmax map: its entropy is None, the softmax layers' are numbers
    assert [e is None for e in whole["entropy_by_layer"]] == [
        kind == "gdn" for kind in model.config.layer_kinds
    ]
    assert_figures_close(whole["massive"], [massive(h) for h in hidden], rel=1e-5, what="massive")
    monkeypatch.setattr(diagnostics, "BATCH_FLOATS", 1)  # one sequence per batch
    one_by_one = run_diagnostics(model, tokens)
    assert one_by_one["entropy_missing"] == whole["entropy_missing"]  # words and None, compared as they are
    for key in KEYS - {"entropy_missing"}:
        assert_figures_close(one_by_one[key], whole[key], rel=1e-5, what=key)


def test_held_out_sequences_spread_over_the_text_without_overlap():
    text = torch.arange(1000)
    rows = held_out_sequences(text, n_sequences=10, seq_len=64)
    assert rows.shape == (10, 64) and rows.dtype == torch.int64
    assert rows[0, 0] == 0 and rows[-1, -1] == 999  # the whole text, first to last token
    assert len(set(rows.flatten().tolist())) == 640  # no token twice
    assert held_out_sequences(text, n_sequences=100, seq_len=64).shape == (15, 64)  # as many as fit
    with pytest.raises(diagnostics.UserError, match=r"^--diagnostics: the text has 1000 tokens"):
        held_out_sequences(text, seq_len=2000)


def test_bad_tokens_are_refused_in_one_line(monkeypatch):
    model = tiny_model("mha", monkeypatch)
    with pytest.raises(diagnostics.UserError, match="block_size=16"):
        run_diagnostics(model, torch.zeros(2, 17, dtype=torch.long))
    with pytest.raises(diagnostics.UserError, match=r"\(N, T\) tensor"):
        run_diagnostics(model, torch.zeros(17, dtype=torch.long))


# ------------------------------------------------------------------------------- the command


def test_evaluate_diagnostics_end_to_end(tmp_path, capsys):
    text = "\n".join(" ".join(random.Random(i).choices(WORDS, k=12)) for i in range(40)) + "\n"
    ckpt = write_checkpoint(tmp_path, text)
    out_json, plots = tmp_path / "out.json", tmp_path / "plots"
    argv = ["--ckpt", str(ckpt), "--lengths", "16", "--diagnostics", "--json", str(out_json)]
    assert eval_main(argv + ["--plots", str(plots)]) == 0
    out = capsys.readouterr().out
    result = json.loads(out_json.read_text())
    figures = result["diagnostics"]
    assert set(figures) == KEYS and figures["seq_len"] == 16  # block_size 16 < 64
    assert figures["n_sequences"] == (result["tokens"] + 1) // 16  # as many as the validation text holds
    assert f"sink rate {figures['sink_rate']:.0%}" in out and "max/median" in out
    assert (plots / "diagnostics.png").is_file()
    model, tokenizer, raw = load_checkpoint(str(ckpt))  # the API the ablation calls: the same figures
    tokens = validation_sequences(raw["minitx"]["train_config"], tokenizer, seq_len=16)
    assert run_diagnostics(model, tokens) == figures
    # a task run has no held-out text: refused in one line before any work
    raw = torch.load(ckpt, weights_only=True)
    raw["minitx"]["train_config"] = {"data": {"source": "mqar"}}
    torch.save(raw, ckpt)
    assert eval_main(["--ckpt", str(ckpt), "--diagnostics"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--diagnostics: the run trained on the synthetic task 'mqar'" in err
    assert math.isfinite(figures["entropy"])


@pytest.mark.parametrize("layers", [["gdn", "mha"], ["gdn", "gdn"]])
def test_evaluate_diagnostics_marks_layers_with_no_softmax_map(tmp_path, capsys, layers):
    """A hybrid's figures come from its softmax layer; its gdn layers and a model of gdn alone show
    "-" where a figure reads a softmax map, and the report says why. The plots are drawn as well."""
    text = "\n".join(" ".join(random.Random(i).choices(WORDS, k=12)) for i in range(40)) + "\n"
    attention = dict(layers=layers, options={"gdn": {"chunk_size": 5}})
    ckpt = write_checkpoint(tmp_path, text, attention=attention)
    out_json, plots = tmp_path / "out.json", tmp_path / "plots"
    argv = ["--ckpt", str(ckpt), "--lengths", "16", "--diagnostics", "--json", str(out_json)]
    assert eval_main(argv + ["--plots", str(plots)]) == 0
    out = capsys.readouterr().out
    figures = json.loads(out_json.read_text())["diagnostics"]
    assert figures["entropy_by_layer"][0] is None and len(figures["massive"]) == len(layers)
    rows = [line.split() for line in out.splitlines() if line.split()[1:2] == ["gdn"]]
    assert len(rows) == layers.count("gdn") and all(row[-1] == "-" for row in rows)
    assert (
        "a gdn layer has no softmax map (a linear recurrence" in out and (plots / "diagnostics.png").is_file()
    )
    if "mha" in layers:
        assert 0 < figures["first_token_share"] <= 1 and f"sink rate {figures['sink_rate']:.0%}" in out
    else:
        assert figures["first_token_share"] is None and "first-token share -   sink rate -" in out


def test_a_map_that_is_no_distribution_has_no_entropy():
    """MTA's weights after its post-softmax convolution and head mixing may exceed 1 in a row or
    fall below 0: -sum p log p of them is no entropy (it goes negative), so such a layer has none."""
    T = 6
    uniform = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1).unsqueeze(1)
    mixed = uniform.clone()
    mixed[3] *= 3.0  # a row summing to 3
    negative = uniform.clone()
    negative[4, 0] = -0.1
    figures = map_figures([uniform.view(1, 1, T, T), mixed.view(1, 1, T, T), negative.view(1, 1, T, T)])
    assert figures["entropy_by_layer"][0] == pytest.approx(1.0, abs=1e-6)
    assert figures["entropy_by_layer"][1:] == [None, None]
    assert figures["entropy_missing"] == [None, "not a distribution", "not a distribution"]
    assert figures["entropy"] == pytest.approx(1.0, abs=1e-6)


def test_mta_layers_whose_map_is_no_distribution_say_so():
    """MTA's map is the one its values read, after the post-softmax convolution and head mixing;
    once the mixing weights leave the identity (here: negated on layer 1) a weight falls below 0,
    and the report says that, not gdn's reason, for its "-"."""
    from minitx.evaluation.report import diagnostic_rows

    torch.manual_seed(0)
    options = {"mta": {"query_kernel": 2, "key_kernel": 3, "conv_layers": [0, 1], "head_mix": "both"}}
    config = ModelConfig(
        n_layer=2,
        n_head=4,
        d_model=32,
        block_size=16,
        vocab_size=11,
        attention=AttentionConfig(kind="mta", options=options),
    )
    model = Transformer(config)
    with torch.no_grad():
        model.blocks[1].attn.mix_post.mul_(-1.0)
    figures = run_diagnostics(model, torch.randint(0, 11, (3, 12)))
    assert figures["entropy_by_layer"][0] is not None and figures["entropy_missing"][0] is None
    assert figures["entropy_by_layer"][1] is None and figures["entropy_missing"][1] == "not a distribution"
    out = "\n".join(diagnostic_rows(figures, ["mta", "mta"]))
    assert "(-: mta's map, the one its values read after the post-softmax convolution" in out
    assert "no softmax map" not in out
