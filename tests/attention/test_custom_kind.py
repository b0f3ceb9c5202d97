"""An attention kind defined outside minitx (examples/custom_attention.py), with an option of its own.

Without any edit to minitx it must be exact (fast path = materialised reference, at awkward
lengths), causal, decode with its cache exactly as without (past the context too), train through
train.py from examples/custom_attention.yaml with its option overridden on the command line,
generate and evaluate (its checkpoint importing the file only with --trust-kind-modules), resume,
and ablate beside MHA through the commands.
"""

from __future__ import annotations

import csv
import json
import math
import sys

import pytest
import torch

from minitx import AttentionConfig, KindLayer, ModelConfig, Transformer, import_kind_modules
from minitx.cli import ablate_main, eval_main, export_main, generate_main, train_main
from minitx.decoding.loop import generate
from minitx.errors import UserError
from minitx.files.configs import REPO_ROOT
from minitx.kinds import registry, unregister
from minitx.verify import cached_logits, causality_violation

EXAMPLE = "examples/custom_attention.py"  # as the example's YAML names it: relative to the repo root


@pytest.fixture(autouse=True)
def in_repo_root(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)


def config(layers=None, n_kv_head=None, block_size=24, n_layer=3, **options) -> ModelConfig:
    import_kind_modules([EXAMPLE])  # a config names the file; importing it is the caller's (once)
    attention = AttentionConfig(
        kind="ssmax",
        layers=layers,
        n_kv_head=n_kv_head,
        options={"ssmax": options} if options else {},
        kind_modules=[EXAMPLE],
    )
    return ModelConfig(
        vocab_size=29, block_size=block_size, n_layer=n_layer, n_head=4, d_model=32, attention=attention
    )


def perturbed(model: Transformer) -> Transformer:
    """Each layer's learned scales moved apart, so a mix-up of heads or positions shows."""
    with torch.no_grad():
        for block in model.blocks:
            if hasattr(block.attn, "s"):
                block.attn.s.copy_(0.5 + torch.rand_like(block.attn.s))
    return model.eval()


def test_the_kind_comes_from_its_own_file_with_its_own_options():
    model = Transformer(config(scale_init=0.75, per_head=False))
    layer = model.blocks[0].attn
    assert type(layer).__name__ == "SSMaxAttention" and registry["ssmax"].module is type(layer)
    assert layer.s.shape == (1,) and torch.all(layer.s == 0.75)  # init_extra kept the option's value
    assert model.config.attention.options == {"ssmax": {"scale_init": 0.75, "per_head": False}}
    assert Transformer(config()).blocks[1].attn.s.shape == (4,)  # the default: one s per head
    with pytest.raises(UserError, match=r"^attention\.options\.ssmax\.scale_init: is -1\.0; use a positive"):
        config(scale_init=-1)
    with pytest.raises(UserError, match=r"^attention\.options\.ssmax\.scale: .*did you mean scale_init"):
        config(scale=2.0)
    with pytest.raises(
        UserError, match=r"^attention\.kind_modules: 'examples/nothing\.py' cannot be imported"
    ):
        import_kind_modules(["examples/nothing.py"])
    # A config only names its modules: it imports none (a missing file is no error of its own) ...
    AttentionConfig(kind="mha", kind_modules=["examples/nothing.py"])
    # ... so a kind no module imported so far registers is refused, saying what to import.
    with pytest.raises(
        UserError,
        match=r"^attention\.kind: kind 'unheard' is not registered, and attention\.kind_modules "
        r"\(examples/nothing\.py\) is not imported: .*call minitx\.import_kind_modules",
    ):
        AttentionConfig(kind="unheard", kind_modules=["examples/nothing.py"])


def test_the_kind_has_what_kind_layer_declares():
    layer = perturbed(Transformer(config(n_kv_head=2))).blocks[0].attn
    assert isinstance(layer, KindLayer) and type(layer).missing() == []
    assert layer.n_head == 4  # the FLOP count's sdpa_flops reads it
    # Softmax maps come from KindLayer's defaults, which read the kind's project and reference.
    (maps,) = layer.softmax_maps(torch.randn(2, 7, 32))
    assert maps.shape == (2, 4, 7, 7)
    assert torch.allclose(maps.sum(-1), torch.ones(2, 4, 7)) and maps.triu(1).abs().max() == 0
    assert layer.flops_per_token(7) > 0


@pytest.mark.parametrize("T", [1, 7, 23])  # 1 and lengths that are no multiple of anything
def test_fast_path_equals_the_materialised_reference(T):
    layer = perturbed(Transformer(config(n_kv_head=2))).blocks[0].attn.double()
    q, k, v = (
        torch.randn(2, 4, T, 8).double(),
        torch.randn(2, 2, T, 8).double(),
        torch.randn(2, 2, T, 8).double(),
    )
    out, weights = layer.reference(q, k, v)
    assert (layer.attend(q, k, v) - out).abs().max() < 1e-12
    # The reference is the formula: softmax(s_h log(i + 1) q_i k_j / sqrt(D)) over j <= i.
    i = T - 1
    scores = (q[0, 3, i] @ k[0, 1, : i + 1].T) * layer.s[3] * math.log(i + 1) / math.sqrt(8)
    assert (weights[0, 3, i, : i + 1] - scores.softmax(-1)).abs().max() < 1e-12


def test_causal_alone_and_mixed_with_built_in_kinds():
    for layers in (None, ["ssmax", "local", "mta"]):
        model = perturbed(Transformer(config(layers=layers, n_kv_head=2)))
        assert causality_violation(model, T=19) == (0.0, 0.0), layers


def test_cached_decoding_equals_the_full_forward_and_slides_past_the_context():
    model = perturbed(Transformer(config(layers=["ssmax", "gqa"], n_kv_head=2, block_size=16)))
    seq = torch.randint(0, 29, (2, 16))
    with torch.no_grad():
        full = model(seq)[:, 4:]
    assert (cached_logits(model, seq, prompt_len=5) - full).abs().max() < 1e-5
    # Past the context: a prompt longer than block_size goes through the cached path several tokens
    # at a time, where the cache's mask says how many keys each query sees; then one at a time.
    # One layer with RoPE slides exactly like a fresh pass over the last block_size tokens (deeper,
    # the cached keys of earlier layers remember more than the crop).
    one = perturbed(Transformer(config(n_kv_head=2, block_size=16, n_layer=1)))
    long = torch.randint(0, 29, (2, 30))
    with torch.no_grad():
        cropped = torch.stack([one(long[:, t - 15 : t + 1])[:, -1] for t in range(20, 30)], dim=1)
    assert (cached_logits(one, long, prompt_len=21) - cropped).abs().max() < 1e-5
    prompt = seq[:, :3]  # and through the decoding loop, 3 x block_size
    with torch.no_grad():
        cached = generate(model, prompt, 45, temperature=0)
        uncached = generate(model, prompt, 45, temperature=0, use_cache=False)
    assert torch.equal(cached, uncached)


TINY = [
    "--trainer.max_steps", "6", "--trainer.val_check_interval", "3", "--data.val_batches", "1",
    "--data.batch_size", "2", "--model.block_size", "32", "--model.n_layer", "2", "--model.d_model", "32",
    "--run.sample_tokens", "8", "--trainer.accelerator", "cpu",
]  # fmt: skip


def test_trains_generates_and_evaluates_through_the_commands(tmp_path, capsys):
    args = ["--config", "examples/custom_attention.yaml", "--model.attention.options.ssmax.scale_init", "0.5"]
    assert train_main([*args, *TINY, "--run.root", str(tmp_path)]) == 0
    checkpoint = tmp_path / "custom_attention" / "checkpoints" / "last.ckpt"
    saved = torch.load(checkpoint, weights_only=True)["minitx"]["model_config"]["attention"]
    assert saved["kind"] == "ssmax" and saved["options"] == {"ssmax": {"scale_init": 0.5, "per_head": True}}
    assert saved["kind_modules"] == [EXAMPLE]

    # As in a new process: the checkpoint imports the example's file only with --trust-kind-modules.
    forget_example()
    generating = ["--ckpt", str(checkpoint), "--temperature", "0", "--max-new-tokens", "70"]
    capsys.readouterr()
    assert generate_main(generating) == 2
    refusal = capsys.readouterr().err.strip()
    assert "\n" not in refusal and f"would import and run {EXAMPLE}" in refusal
    assert "--trust-kind-modules" in refusal and "ssmax" not in registry
    texts = []
    for extra in ([], ["--no-cache"]):
        assert generate_main([*generating, "--trust-kind-modules", *extra]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] and len(texts[0]) > 70  # past the context of 32, cache or not

    forget_example()
    report = tmp_path / "evaluation.json"
    evaluating = ["--ckpt", str(checkpoint), "--max-tokens", "600", "--json", str(report), "--no-progress"]
    assert eval_main(evaluating) == 2 and not report.exists()
    assert eval_main([*evaluating, "--trust-kind-modules"]) == 0
    assert math.isfinite(json.loads(report.read_text())["loss"])

    forget_example()
    capsys.readouterr()  # export is refused in one line: no exported code knows the kind
    assert export_main(["--ckpt", str(checkpoint), "--out", str(tmp_path / "hf")]) == 2
    refusal = capsys.readouterr().err.strip()
    assert "\n" not in refusal and "uses attention kind ssmax, defined outside minitx" in refusal
    assert not (tmp_path / "hf").exists() and "ssmax" not in registry  # refused without importing it

    # The run's config names the file: resuming the run imports it, with no flag.
    resume = ["--run.root", str(tmp_path), "--ckpt_path", "last", "--trainer.max_steps", "8"]
    assert train_main([*args, *TINY, *resume]) == 0 and "ssmax" in registry


def forget_example() -> None:
    """This process as a new one would be: kind ssmax unknown, the example's file not imported."""
    unregister("ssmax")
    for name in [name for name in sys.modules if name.startswith("minitx_kinds_custom_attention_")]:
        del sys.modules[name]


@pytest.mark.slow  # two training runs through ablate: about 35 s of CPU
def test_ablates_beside_mha(tmp_path):
    output = tmp_path / "sweep"
    code = ablate_main(
        [
            "--config",
            "examples/custom_attention_ablation.yaml",
            "--output",
            str(output),
            "--only",
            "mha,ssmax",
        ]
        + ["--parallel", "2", "--", *TINY, "--run.sample_tokens", "0", "--model.warmup_steps", "1"]
    )
    assert code == 0
    with open(output / "results.csv", newline="", encoding="utf-8") as handle:
        rows = {row["variant"]: row for row in csv.DictReader(handle)}
    assert set(rows) == {"mha", "ssmax"}
    assert all(row["status"] == "ok" and math.isfinite(float(row["final_val_loss"])) for row in rows.values())
    # The same shape but for ssmax's 4 scales in each of its 2 layers: the budget is equal.
    assert int(rows["ssmax"]["params"]) - int(rows["mha"]["params"]) == 2 * 4
