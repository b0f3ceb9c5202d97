"""The ablation command: a real sweep of tiny runs end to end, resuming, failures, the table maths."""

import csv
import json
import math
from pathlib import Path

import pytest
import yaml

from minitx import ablation
from minitx.ablation.plan import budget
from minitx.ablation.plan.commands import is_synthetic
from minitx.ablation.runs import eval_runs
from minitx.cli import ablate_main
from minitx.errors import UserError
from minitx.flops import FLOP_CONVENTION, OLDER_CONVENTION
from minitx.model import Transformer

TINY_MODEL = {"n_layer": 1, "n_head": 2, "d_model": 16, "block_size": 16, "lr": 1e-2, "warmup_steps": 1}


def write_sweep(tmp_path: Path, variants: list[dict], **extra) -> Path:
    text = tmp_path / "corpus.txt"
    # Enough distinct text for a train/val split of a few windows each, generated, not shipped.
    words = ["attention", "query", "key", "value", "head", "cache", "token", "window", "layer"]
    text.write_text(" ".join(words[(i * 7 + i // 3) % len(words)] for i in range(600)), encoding="utf-8")
    sweep = {
        "base": {
            "seed_everything": 1,
            "model": TINY_MODEL,
            "data": {
                "source": "files",
                "train_files": str(text),
                "batch_size": 4,
                "val_batches": 1,
                "cache_dir": str(tmp_path / "cache"),
            },
            "trainer": {
                "max_steps": 4,
                "val_check_interval": 2,
                "log_every_n_steps": 1,
                "accelerator": "cpu",
                "devices": 1,
            },
        },
        "seed": 5,
        "variants": variants,
        **extra,
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep), encoding="utf-8")
    return path


def read_rows(output: Path) -> list[dict]:
    with open(output / "results.csv", newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
def test_sweep_end_to_end_with_a_failing_variant_then_a_rerun_that_skips_finished_runs(tmp_path, capsys):
    variants = [
        {"name": "mha", "overrides": {"model.attention.kind": "mha"}},
        {"name": "gqa", "overrides": {"model.attention": {"kind": "gqa", "n_kv_head": 1}}},
        # Fails when it runs: the corpus has no "p". (A config mistake, such as an unknown attention
        # kind, stops the whole sweep before any run: tests/training/test_failures.py.)
        {"name": "broken", "overrides": {"run.sample_prompt": "nope"}},
    ]
    sweep = write_sweep(tmp_path, variants)
    output = tmp_path / "out"
    assert ablate_main(["--config", str(sweep), "--output", str(output), "--parallel", "2"]) == 0

    rows = {row["variant"]: row for row in read_rows(output)}
    assert set(rows) == {"mha", "gqa", "broken"}
    for name in ("mha", "gqa"):
        row = rows[name]
        assert row["status"] == "ok" and row["seed"] == "5"
        for key in (
            "final_val_loss",
            "best_val_loss",
            "val_perplexity",
            "tokens_per_s",
            "peak_memory_mb",
            "wall_time_s",
        ):
            assert math.isfinite(float(row[key])) and float(row[key]) > 0, key
        assert row["flop_convention"] == FLOP_CONVENTION  # the count its summary recorded, and by what
        assert float(row["best_val_loss"]) <= float(row["final_val_loss"])
        assert float(row["val_perplexity"]) == pytest.approx(math.exp(float(row["final_val_loss"])))
        assert int(row["tokens_seen"]) == 4 * 4 * 16 and int(row["steps"]) == 4  # the shared budget
        assert row["memory_kind"] == "cpu peak RSS"
    # Same block size and heads: GQA with one kv head (MQA) caches half of MHA's two heads.
    assert float(rows["gqa"]["kv_bytes_per_token"]) * 2 == float(rows["mha"]["kv_bytes_per_token"])
    assert int(rows["gqa"]["params"]) < int(rows["mha"]["params"])
    assert rows["broken"]["status"] == "failed" and "run.sample_prompt" in rows["broken"]["error"]

    table = (output / "results.md").read_text(encoding="utf-8")
    assert "| mha |" in table and "| gqa |" in table
    assert "failed" in table and "run.sample_prompt" in table  # the error's last line, in the status column
    assert "up to 2 at a time" in table  # parallel runs share the cores: their speed is not alone
    for name in ("loss_curves.png", "cost_quality.png", "loss_vs_context.png"):
        assert (output / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (
            output / name
        ).stat().st_size > 5000
    # Every finished run was evaluated on its best checkpoint: held-out loss, bits per character and
    # the loss at 1x, 2x and 4x block_size (RoPE goes past block_size); the failed run has no figures.
    for name in ("mha", "gqa"):
        row = rows[name]
        for key in (
            "eval_loss",
            "eval_bits_per_char",
            "loss_at_16",
            "loss_at_32",
            "loss_at_64",
            "params_non_embedding",
            "flops_per_token",
        ):
            assert math.isfinite(float(row[key])) and float(row[key]) > 0, key
        assert float(row["eval_loss"]) == float(row["loss_at_16"]) and row["eval_note"] == ""
        assert int(row["params_non_embedding"]) < int(row["params"])
    assert (
        rows["broken"]["eval_loss"] == ""
        and not (output / "runs" / "broken-seed5" / "evaluation.json").exists()
    )
    assert "held-out loss" in table and "loss @ 64" in table
    # ... and diagnosed on its held-out text: the figures in its row, a table and a plot per figure.
    for name in ("mha", "gqa"):
        assert 0 <= float(rows[name]["first_token_share"]) <= 1 and 0 <= float(rows[name]["entropy"]) <= 1
        assert float(rows[name]["massive_ratio"]) >= 1 and rows[name]["diagnostics_note"] == ""
        assert (output / "runs" / f"{name}-seed5" / "diagnostics.json").is_file()
    assert rows["broken"]["sink_rate"] == "" and "## Diagnostics" in table
    assert all((output / name).is_file() for name in ablation.PLOTS)
    # Every run read the sweep's own copy of the base config, not the (editable) original.
    base = yaml.safe_load(sweep.read_text())["base"]
    assert yaml.safe_load((output / "base_config.yaml").read_text()) == base
    assert (
        yaml.safe_load((output / "runs" / "mha-seed5" / "config.yaml").read_text())["model"]["d_model"]
        == base["model"]["d_model"]
    )
    summary = json.loads((output / "runs" / "mha-seed5" / "summary.json").read_text())
    assert [p["step"] for p in summary["curve"]] == [2, 4]
    assert [p["tokens"] for p in summary["curve"]] == [128, 256]

    # A rerun leaves finished runs alone and retries the failed one.
    finished = {
        (name, file): (output / "runs" / f"{name}-seed5" / file).stat().st_mtime_ns
        for name in ("mha", "gqa")
        for file in ("run.json", "evaluation.json", "diagnostics.json")
    }
    capsys.readouterr()
    assert ablate_main(["--config", str(sweep), "--output", str(output)]) == 0
    printed = capsys.readouterr().out
    assert (
        "skip   mha seed 5" in printed
        and "skip   gqa seed 5" in printed
        and "start  broken seed 5" in printed
    )
    assert "eval   mha" not in printed and "eval   gqa" not in printed  # cached: not evaluated again
    assert "diagnostics of" not in printed
    for (name, file), mtime in finished.items():
        assert (output / "runs" / f"{name}-seed5" / file).stat().st_mtime_ns == mtime, (name, file)
    assert {row["variant"]: row["status"] for row in read_rows(output)} == {
        "mha": "ok",
        "gqa": "ok",
        "broken": "failed",
    }

    # Changing a variant's settings under the same output is refused, not silently mixed in.
    variants[0]["overrides"]["model.attention.kind"] = "mqa"
    write_sweep(tmp_path, variants)
    assert ablate_main(["--config", str(sweep), "--output", str(output), "--only", "mha"]) == 2
    assert "different settings" in capsys.readouterr().err


def test_every_run_gets_the_same_seeds_data_and_budget(tmp_path):
    sweep_path = write_sweep(
        tmp_path,
        [{"name": "a", "overrides": {"model.attention.kind": "mqa"}}, {"name": "b", "overrides": {}}],
    )
    sweep = ablation.load_sweep(sweep_path)
    runs = ablation.plan_runs(sweep, tmp_path / "out", seeds=3)
    assert [(r.variant.name, r.seed) for r in runs] == [
        ("a", 5),
        ("a", 6),
        ("a", 7),
        ("b", 5),
        ("b", 6),
        ("b", 7),
    ]
    for run in runs:
        command = run.command
        assert command[command.index("--seed_everything") + 1] == str(run.seed)
        assert command[command.index("--data.seed") + 1] == str(run.seed)
        assert command[command.index("--run.name") + 1] == f"{run.variant.name}-seed{run.seed}"
        assert command[command.index("--config") + 1] == str(tmp_path / "out" / "base_config.yaml")
    assert len({r.fingerprint for r in runs}) == len(runs)


def test_variants_may_not_change_the_budget_unless_allowed(tmp_path):
    for key in ("data.batch_size", "trainer.max_steps", "model.block_size", "seed_everything", "data.seed"):
        path = write_sweep(tmp_path, [{"name": "v", "overrides": {key: 8}}])
        with pytest.raises(UserError, match=key):
            ablation.load_sweep(path)
    path = write_sweep(
        tmp_path, [{"name": "v", "overrides": {"data.batch_size": 8}, "allow_budget_change": True}]
    )
    sweep = ablation.load_sweep(path)
    assert sweep.variants[0].budget_changes() == {"data.batch_size": 8}
    # The shared overrides may change the budget: they change it for every variant alike.
    path = write_sweep(tmp_path, [{"name": "v", "overrides": {}}], overrides={"trainer.max_steps": 9})
    assert ablation.load_sweep(path).overrides == {"trainer.max_steps": 9}


def test_a_config_mistake_is_named_as_the_variants_or_the_bases(tmp_path):
    # A variant with overrides first: one without any is the base's at once.
    variants = [{"name": "b", "overrides": {"model.dropout": 0.0}}, {"name": "a", "overrides": {}}]
    mistakes = [
        ({"model.eps": 0}, "model.eps: is 0.0"),  # found before Lightning is imported
        ({"trainer.precision": "bogus"}, "trainer.precision"),  # found by LightningCLI's parse alone
    ]
    for overrides, found in mistakes:
        shared = write_sweep(tmp_path, variants, overrides=overrides)
        with pytest.raises(UserError, match=f"base config or shared overrides: {found}"):
            ablation.check_variants(ablation.load_sweep(shared), shared)
        own = write_sweep(tmp_path, [variants[1], {"name": "b", "overrides": overrides}])
        with pytest.raises(UserError, match=f"variant 'b': {found}"):
            ablation.check_variants(ablation.load_sweep(own), own)


def test_a_warmup_as_long_as_the_run_is_refused_before_any_run(tmp_path, capsys):
    """As a designed sweep's budget refuses it: the variants would be compared before any reached
    its learning rate. The base's, or one the arguments after -- make (a variant's own is named as
    any mistake of a variant is: test_a_config_mistake_is_named_as_the_variants_or_the_bases)."""
    shared = write_sweep(tmp_path, [{"name": "a"}], overrides={"model.warmup_steps": 4})  # max_steps 4
    with pytest.raises(
        UserError, match="base config or shared overrides: model.warmup_steps 4 is not less than"
    ):
        ablation.check_variants(ablation.load_sweep(shared), shared)
    fine = write_sweep(tmp_path, [{"name": "a"}])  # warmup 1
    output = tmp_path / "out"
    assert (
        ablate_main(["--config", str(fine), "--output", str(output), "--", "--trainer.max_steps", "1"]) == 2
    )
    err = capsys.readouterr().err.strip()
    assert "model.warmup_steps 1 is not less than trainer.max_steps 1" in err and "\n" not in err
    assert "lower model.warmup_steps or raise trainer.max_steps" in err and not output.exists()


@pytest.mark.parametrize(
    "variants,extra,message",
    [
        ([], {}, "non-empty list"),
        ([{"name": "a"}, {"name": "a"}], {}, "duplicate"),
        ([{"name": "a/b"}], {}, "folder"),
        ([{"name": "a", "overrides": {"run.name": "x"}}], {}, "run.name"),
        ([{"name": "a", "overrides": {"run": {"root": "x"}}}], {}, "run.root"),
        ([{"name": "a", "overides": {}}], {}, "overides"),
        ([{"name": "a"}], {"seeds": 0}, "seeds"),
    ],
)
def test_bad_sweep_files_are_user_errors(tmp_path, variants, extra, message):
    path = write_sweep(tmp_path, variants, **extra)
    with pytest.raises(UserError, match=message):
        ablation.load_sweep(path)


def test_bad_command_lines_exit_2_with_one_line(tmp_path, capsys):
    assert ablate_main(["--config", str(tmp_path / "missing.yaml"), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "not found" in err and len(err.strip().splitlines()) == 1
    path = write_sweep(tmp_path, [{"name": "a"}])
    assert ablate_main(["--config", str(path), "--output", str(tmp_path / "o"), "--only", "zzz"]) == 2
    assert "zzz" in capsys.readouterr().err


def test_mean_std_and_table_formatting():
    assert ablation.mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)  # sample std
    assert ablation.mean_std([4.0]) == (4.0, None)
    assert ablation.mean_std([None, None]) == (None, None)
    assert ablation.format_cell(1.23456, 0.0012, "{:.3f}") == "1.235 ± 0.001"
    assert ablation.format_cell(1.23456, None, "{:.3f}") == "1.235"
    curve_a = [{"tokens": 10, "val_loss": 3.0}, {"tokens": 20, "val_loss": 2.0}]
    curve_b = [{"tokens": 10, "val_loss": 1.0}, {"tokens": 20, "val_loss": 2.0}]
    assert ablation.mean_curve([curve_a, curve_b]) == [(10, 2.0, pytest.approx(math.sqrt(2))), (20, 2.0, 0.0)]


def test_aggregate_reports_failures_and_spread():
    def row(variant, status, loss, error=""):
        base = {key: None for key, *_ in ablation.COLUMNS}
        base.update(
            variant=variant,
            status=status,
            error=error,
            final_val_loss=loss,
            best_val_loss=loss,
            curve=[],
            memory_kind=None,
            budget_changes="",
        )
        return base

    rows = [row("a", "ok", 2.0), row("a", "ok", 4.0), row("a", "failed", None, "boom"), row("b", "ok", 1.0)]
    table = {entry["variant"]: entry for entry in ablation.aggregate(rows)}
    assert table["a"]["final_val_loss"] == (3.0, pytest.approx(math.sqrt(2)))
    assert table["a"]["ok"] == 2 and table["a"]["runs"] == 3 and "1/3 failed: boom" == table["a"]["status"]
    assert table["b"]["status"] == "ok" and table["b"]["final_val_loss"] == (1.0, None)
    text = ablation.markdown_table(list(table.values()), "t")
    assert "| a | 3.0000 ± 1.4142 |" in text and "| 2/3 | 1/3 failed: boom |" in text


# ------------------------------------------------------------------------------ equal budgets

MATCH_VARIANTS = [
    {"name": "mha", "overrides": {"model.attention.kind": "mha"}},
    {"name": "mqa", "overrides": {"model.attention.kind": "mqa"}},
    {"name": "gqa", "overrides": {"model.attention": {"kind": "gqa", "n_kv_head": 2}}},
    {
        "name": "mta",
        "overrides": {"model.attention": {"kind": "mta", "options": {"mta": {"conv_layers": [1]}}}},
    },
]
MATCH_SHAPE = {"model.n_layer": 2, "model.n_head": 4, "model.d_model": 32}


def outside_tables(model: Transformer) -> int:
    """Parameters outside the token and position tables and the output layer, counted by name."""
    return sum(
        p.numel()
        for name, p in model.named_parameters()
        if not name.startswith(("tok_emb.", "pos_emb.", "lm_head."))
    )


def measured(sweep, variant, by: str) -> float:
    model = Transformer(budget.model_config_of(sweep, variant))
    if by == "params":
        return outside_tables(model)
    return model.flops_per_token() - 6 * model.tok_emb.weight.numel()  # the output layer's matmul left out


@pytest.mark.parametrize("by", ["params", "flops"])
def test_match_brings_every_kind_within_2_percent_of_the_first(tmp_path, by):
    path = write_sweep(tmp_path, MATCH_VARIANTS, overrides=MATCH_SHAPE, match=by)
    unmatched = ablation.load_sweep(path)
    before = {v.name: measured(unmatched, v, by) for v in unmatched.variants}
    assert before["mqa"] < 0.95 * before["mha"]  # a real gap to close: a no-op match would fail below

    sweep = ablation.load_sweep(path)
    log = []
    ablation.match_budgets(sweep, by, log=log.append)
    after = {v.name: measured(sweep, v, by) for v in sweep.variants}
    for name, value in after.items():
        assert abs(value / after["mha"] - 1) <= 0.02, (name, value, after["mha"])
    mqa = next(v for v in sweep.variants if v.name == "mqa")
    assert mqa.overrides["model.mlp_hidden_size"] > 4 * 32 and "MLP width 128 ->" in mqa.resized
    assert any(line.startswith("ablate: match  mqa: MLP width 128 ->") for line in log)
    # The runs train that width: the training command accepts it, and each run's command carries it.
    ablation.check_variants(sweep, path)
    run = next(r for r in ablation.plan_runs(sweep, tmp_path / "out", seeds=1) if r.variant.name == "mqa")
    assert run.command[run.command.index("--model.mlp_hidden_size") + 1] == str(
        mqa.overrides["model.mlp_hidden_size"]
    )


def test_match_refuses_what_no_mlp_width_can_reach(tmp_path, capsys):
    # Three layers' attention alone outweigh the whole one-layer reference: no width gets within 2%.
    variants = [{"name": "small", "overrides": {}}, {"name": "deep", "overrides": {"model.n_layer": 3}}]
    path = write_sweep(tmp_path, variants, match="params")
    assert ablate_main(["--config", str(path), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'deep'" in err and "2%" in err and "width 1 gives" in err
    assert not (tmp_path / "out").exists()
    with pytest.raises(UserError, match="match"):
        ablation.load_sweep(write_sweep(tmp_path, variants, match="size"))
    # A config mistake found while sizing reads as check_variants' would: the variant and the key.
    path = write_sweep(
        tmp_path,
        [{"name": "a"}, {"name": "b", "overrides": {"model.attention.kind": "flash"}}],
        match="flops",
    )
    assert ablate_main(["--config", str(path), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "variant 'b': model.attention.kind: unknown kind 'flash'" in err


# ------------------------------------------------------------------------------ seeds


def planted_runs(directory: Path, losses: dict[str, list[float]], base_text: str = "model: {}\n") -> list:
    """Finished runs without training: per variant one run per loss given (its final val loss),
    each with a summary and checkpoint files, as a sweep of that many seeds leaves them."""
    seeds = max(len(values) for values in losses.values())
    sweep = ablation.Sweep(
        base_text=base_text, overrides={}, variants=[ablation.Variant(name, {}) for name in losses]
    )
    runs = []
    for run in ablation.plan_runs(sweep, directory, seeds=seeds):
        values = losses[run.variant.name]
        if run.seed - sweep.seed >= len(values):
            continue  # fewer seeds than the others: never run
        loss = values[run.seed - sweep.seed]
        (run.directory / "checkpoints").mkdir(parents=True)
        for name in ("best.ckpt", "last.ckpt"):
            (run.directory / "checkpoints" / name).write_bytes(b"weights")
        summary = {"block_size": 16, "final_val_loss": loss, "best_val_loss": loss, "curve": []}
        (run.directory / ablation.SUMMARY_FILE).write_text(json.dumps(summary))
        runs.append(run)
    return runs


def sweep_of(runs: list, **settings) -> "ablation.Sweep":
    return ablation.Sweep(
        base_text="",
        overrides={},
        variants=list({r.variant.name: r.variant for r in runs}.values()),
        **settings,
    )


def plant_evaluations(runs: list, monkeypatch, shift: float) -> None:
    """Each run's held-out loss: its final val loss + shift, through the evaluation cache."""
    by_dir = {str(r.directory): json.loads((r.directory / ablation.SUMMARY_FILE).read_text()) for r in runs}

    def fake_evaluate(path, lengths=None, max_tokens=None, trust_kind_modules=()):
        loss = by_dir[str(Path(path).parents[1])]["final_val_loss"] + shift
        return {"loss": loss, "bits_per_char": loss / math.log(2), "by_length": {"16": {"loss": loss}}}

    monkeypatch.setattr(eval_runs, "evaluate_checkpoint", fake_evaluate)
    eval_runs.evaluate_runs(runs, ablation.EvalSettings(), log=lambda line: None)


REF = [2.00, 2.01, 2.02]
SEEDS = {
    "ref": REF,
    "far": [2.10, 2.11, 2.12],  # 0.1 worse, tight: significant after Holm
    "near": [2.00, 2.03, 1.99],  # the reference's level: not significant
    # Welch p 0.0065 (< 0.01 alone), Holm's x2 lifts it to 0.013 (Student's p would be 0.0022)
    "edge": [2.05, 2.055, 2.06],
    "one": [1.5],  # one seed: no test
}


def differences_table(text: str) -> dict[str, list[str]]:
    section = text.split("## Differences from ref", 1)[1].split("\n## ", 1)[0]
    rows = [
        line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| variant")
    ]
    return {cells[0]: cells[1:] for cells in ([c.strip() for c in row.strip("|").split("|")] for row in rows)}


def test_differences_from_the_reference_are_welch_tests_holm_corrected(tmp_path, monkeypatch):
    from scipy import stats

    runs = planted_runs(tmp_path, SEEDS)
    plant_evaluations(runs, monkeypatch, shift=0.5)
    ablation.write_results(runs, tmp_path, sweep=sweep_of(runs))
    text = (tmp_path / "results.md").read_text()
    table = differences_table(text)
    # Holm by hand: the smallest of m p-values times m, the next times m - 1, never decreasing.
    raw = {n: stats.ttest_ind(SEEDS[n], REF, equal_var=False).pvalue for n in ("far", "near", "edge")}
    holm = {"far": 3 * raw["far"]}
    holm["edge"] = max(holm["far"], 2 * raw["edge"])
    holm["near"] = max(holm["edge"], raw["near"])
    assert raw["edge"] < 0.01 < holm["edge"]  # the case where the correction decides
    assert set(table) == {"far", "near", "edge", "one"}  # the reference is not compared with itself
    # Both losses are tested, each with its difference, its 95% interval and Holm's p.
    far = table["far"]
    assert far[0] == "3" and far[1].startswith("**+0.1000 [+0.0") and far[2] == f"**{holm['far']:.2g}**"
    assert far[4:] == far[1:4]  # held-out loss: the same differences, shifted alike
    # The verdict in words, as the designed sweep's seeds test gives it, beside its interval.
    assert far[3] == "worse" and table["near"][3] == table["edge"][3] == "no difference found"
    assert table["one"][3] == ""
    low, high = (float(x) for x in far[1].strip("*").split("[")[1].rstrip("]").split(","))
    half = stats.t.ppf(0.975, 4) * math.sqrt(2 * 0.01**2 / 3)  # equal spreads: Welch's df is 4
    assert (low, high) == (pytest.approx(0.1 - half, abs=1e-4), pytest.approx(0.1 + half, abs=1e-4))
    assert "**" not in "".join(table["near"]) and table["near"][2] == f"{holm['near']:.2g}"
    assert "**" not in "".join(table["edge"]) and table["edge"][2] == f"{holm['edge']:.2g}"
    assert table["edge"][1].startswith("+0.0450 [")
    assert table["one"][:2] == ["1", "needs 2+ seeds"]
    assert "| held-out loss: difference [95% CI] | p (Holm) | verdict |" in text
    assert "significant at p < 0.01" in text
    # The spread screen is gone: no marks in the main table, no note about it.
    main = text.split("## Differences", 1)[0]
    assert " * |" not in main and "std + std" not in text
    # results.csv: still one row per run.
    assert len(read_rows(tmp_path)) == len(runs) == 13


def test_variants_equal_to_4_decimals_get_a_note_and_others_none(tmp_path):
    """An arm whose kind is never used trains the reference's model: the same loss on every seed."""
    runs = planted_runs(tmp_path, {"ref": [2.0, 2.01], "unused": [2.00001, 2.01], "other": [2.0, 2.02]})
    ablation.write_results(
        runs, tmp_path, sweep=sweep_of(runs, evaluation=ablation.EvalSettings(enabled=False))
    )
    text = (tmp_path / "results.md").read_text()
    notes = [line for line in text.splitlines() if "equal to 4 decimals" in line]
    assert notes == [
        "**Note:** arms ref and unused are equal to 4 decimals (2 runs of the same seed): is the kind really "
        "used? check model.attention.kind and model.attention.layers of each."
    ]


def test_the_wall_time_of_a_sweep_is_the_union_of_its_runs_spans(tmp_path):
    """Two runs at once (10:00-10:10 and 10:05-10:20), one later (11:00-11:05): 25 min of wall time,
    the hour between left out, 30 min of training processes; a run of an earlier minitx (no end
    time) is counted in the sum and said apart."""
    from minitx.ablation.analysis.wall_time import phase_times, wall_time

    ends = [("2026-12-02T10:10:00+00:00", 600), ("2026-12-02T10:20:00+00:00", 900)]
    ends.append(("2026-12-02T11:05:00+00:00", 300))
    assert wall_time(ends) == (
        "wall time: 25 min 00 s with some run training (the union of the runs' spans, 3 runs), "
        "30 min 00 s of training processes in all (3 runs)"
    )
    assert "1 run(s) kept no end time" in wall_time([*ends, (None, 60)])
    assert wall_time([(None, 3725)]).startswith("time: 1 h 02 min of training processes in all (1 run)")
    assert wall_time([(None, None)]) == ""
    # a designed sweep's phases, each its own union (report/designed.py names them by role)
    assert phase_times({"learning rates": ends[:2], "ladder": ends[2:], "branches": [(None, 5)]}) == (
        "learning rates 20 min 00 s, ladder 5 min 00 s"
    )
    runs = planted_runs(tmp_path, {"ref": [2.0], "other": [2.1]})
    for run, (end, seconds) in zip(runs, ends):
        (run.directory / ablation.RUN_FILE).write_text(
            json.dumps({"status": "ok", "finished_at": end, "process_seconds": seconds})
        )
    ablation.write_results(
        runs, tmp_path, sweep=sweep_of(runs, evaluation=ablation.EvalSettings(enabled=False))
    )
    text = (tmp_path / "results.md").read_text()
    assert "- wall time: 20 min 00 s with some run training (the union of the runs' spans, 2 runs)" in text
    assert [row["finished_at"] for row in read_rows(tmp_path)] == [end for end, _ in ends[:2]]
    # a run's record says when it ended, in UTC, beside its seconds
    from datetime import datetime, timedelta

    from minitx.ablation.runs.runner import finish_record

    record = finish_record(runs[0], {}, 0, 12.0)
    written = json.loads((runs[0].directory / ablation.RUN_FILE).read_text())
    assert written["process_seconds"] == 12.0 and record["status"] == "ok"
    assert datetime.fromisoformat(written["finished_at"]).utcoffset() == timedelta(0)


def test_a_table_of_runs_recorded_before_the_flop_convention_says_so(tmp_path):
    """A summary without flop_convention was written by a minitx that counted each kind's code as
    it ran; the table keeps its figure and names the count, run by run in results.csv."""
    runs = planted_runs(tmp_path, {"ref": [2.0], "old": [2.1]})
    for run, convention in zip(runs, [FLOP_CONVENTION, None]):
        path = run.directory / ablation.SUMMARY_FILE
        summary = {**json.loads(path.read_text()), "flops_per_token": 1.0e6}
        if convention:
            summary["flop_convention"] = convention
        path.write_text(json.dumps(summary))
    ablation.write_results(
        runs, tmp_path, sweep=sweep_of(runs, evaluation=ablation.EvalSettings(enabled=False))
    )
    text = (tmp_path / "results.md").read_text()
    assert f"train FLOPs/token of old: recorded under the older count {OLDER_CONVENTION}" in text
    assert f"convention {FLOP_CONVENTION}" in text
    conventions = {row["variant"]: row["flop_convention"] for row in read_rows(tmp_path)}
    assert conventions == {"ref": FLOP_CONVENTION, "old": OLDER_CONVENTION}


def test_no_differences_section_without_two_seeds_on_both_sides(tmp_path):
    runs = planted_runs(tmp_path, {"ref": [2.0], "other": [2.5, 2.6]})
    ablation.write_results(
        runs, tmp_path, sweep=sweep_of(runs, evaluation=ablation.EvalSettings(enabled=False))
    )
    assert "Differences from" not in (tmp_path / "results.md").read_text()


# ------------------------------------------------------------------------------ diagnostics


def fake_diagnostics(calls: list):
    """eval_runs.diagnose without a model: figures from the run's seed; a run named bad- fails."""

    def diagnose(checkpoint, trust_kind_modules=()):
        run = Path(checkpoint).parents[1].name
        calls.append(run)
        if run.startswith("bad-"):
            raise RuntimeError("no maps\nhere")
        if run.startswith("lin-"):  # gdn alone: no softmax map
            return {"first_token_share": None, "sink_rate": None, "massive_ratio": 3.0, "entropy": None,
                    "loss_by_position": [1.0]}  # fmt: skip
        odd = int(run.rsplit("seed", 1)[1]) % 2
        return {"first_token_share": 0.4 + 0.1 * odd, "sink_rate": 0.5, "massive_ratio": 1000.0 * (odd + 1),
                "entropy": 0.7, "loss_by_position": [1.0]}  # fmt: skip

    return diagnose


def test_diagnostics_of_every_run_in_a_plain_sweep(tmp_path, monkeypatch):
    from minitx.ablation.runs.eval_runs import diagnose_runs

    calls: list = []
    monkeypatch.setattr(eval_runs, "diagnose", fake_diagnostics(calls))
    runs = planted_runs(tmp_path, {"good": [2.0, 2.1], "bad": [2.2], "lin": [2.3]})
    sweep = sweep_of(runs)
    diagnose_runs(runs, sweep, log=lambda line: None)
    assert calls == ["good-seed1337", "good-seed1338", "bad-seed1337", "lin-seed1337"]
    diagnose_runs(runs, sweep, log=lambda line: None)
    assert len(calls) == 5 and calls[-1] == "bad-seed1337"  # cached; a failure is retried

    ablation.write_results(runs, tmp_path, sweep=sweep)
    text = (tmp_path / "results.md").read_text()
    section = text.split("## Diagnostics", 1)[1]
    assert (
        "| first-token share | sink rate | massive act. (max/median) | attention entropy (normalised) |"
        in section
    )
    # Mean ± std over the two seeds; the failed run's row is – with its error under the table.
    assert "| good | 0.450 ± 0.071 | 0.500 ± 0.000 | 1,500.0 ± 707.1 | 0.700 ± 0.000 | 2/2 |" in section
    assert "| bad | – | – | – | – | 1/1 |" in section
    assert "– bad: diagnostics failed: no maps here" in section
    # Each – says why, where it is: here a model with no softmax map.
    assert "| lin | – | – | 3.0 | – | 1/1 |" in section
    assert "– lin, first-token share, sink rate: no layer has a softmax map (gdn alone" in section
    assert "– lin, attention entropy (normalised): no layer's map is a probability distribution" in section
    assert "a synthetic task" not in section  # the reason the report gave before, wrongly
    rows = read_rows(tmp_path)
    assert [r["first_token_share"] for r in rows] == ["0.5", "0.4", "", ""]
    assert [r["massive_ratio"] for r in rows] == ["2000.0", "1000.0", "", "3.0"]
    assert rows[2]["diagnostics_note"] == "diagnostics failed: no maps here"
    for name in ablation.PLOTS:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_no_diagnostics_for_synthetic_tasks_nor_without_evaluation(tmp_path, monkeypatch):
    from minitx.ablation.report.plain import BASE_PLOTS, DIAGNOSTIC_PLOTS
    from minitx.ablation.runs.eval_runs import diagnose_runs

    calls: list = []
    monkeypatch.setattr(eval_runs, "diagnose", fake_diagnostics(calls))
    toy = planted_runs(tmp_path / "toy", {"mha": [2.0, 2.1]}, base_text="data: {source: toy}\n")
    sweep = ablation.Sweep(base_text="data: {source: toy}\n", overrides={}, variants=[toy[0].variant])
    diagnose_runs(toy, sweep, log=lambda line: None)
    assert calls == []  # a synthetic task has no held-out text to read
    ablation.write_results(toy, tmp_path / "toy", sweep=sweep)
    assert "| mha | – | – | – | – | 2/2 |" in (tmp_path / "toy" / "results.md").read_text()
    assert read_rows(tmp_path / "toy")[0]["sink_rate"] == ""
    # A variant that switches a text sweep to a task, and a task given after --, are tasks too.
    text_sweep = ablation.Sweep(base_text="data: {source: files}\n", overrides={}, variants=[])
    assert not is_synthetic(text_sweep, ablation.Variant("v", {}))
    assert is_synthetic(text_sweep, ablation.Variant("v", {"data.source": "mqar"}))
    assert is_synthetic(text_sweep, ablation.Variant("v", {}), ["--data.source", "needle"])

    # eval: false keeps the old report: nothing diagnosed, no section, columns or plots.
    plain = planted_runs(tmp_path / "plain", {"mha": [2.0]})
    off = sweep_of(plain, evaluation=ablation.EvalSettings(enabled=False))
    diagnose_runs(plain, off, log=lambda line: None)
    ablation.write_results(plain, tmp_path / "plain", sweep=off)
    assert calls == [] and "Diagnostics" not in (tmp_path / "plain" / "results.md").read_text()
    assert "sink_rate" not in read_rows(tmp_path / "plain")[0]
    assert ablation.report.plain.plot_names(off) == BASE_PLOTS
    assert not any((tmp_path / "plain" / name).exists() for name in DIAGNOSTIC_PLOTS)


def test_report_only_reads_cached_diagnostics_and_computes_none(tmp_path, monkeypatch, capsys):
    from minitx.ablation.runs.eval_runs import diagnose_runs

    path = write_sweep(
        tmp_path, [{"name": "mha"}, {"name": "mqa", "overrides": {"model.attention.kind": "mqa"}}]
    )
    output = tmp_path / "out"
    sweep = ablation.load_sweep(path)
    runs = ablation.plan_runs(sweep, output, seeds=1)
    for run in runs:
        (run.directory / "checkpoints").mkdir(parents=True)
        (run.directory / "checkpoints" / "last.ckpt").write_bytes(b"weights")
        (run.directory / ablation.SUMMARY_FILE).write_text(json.dumps({"final_val_loss": 2.0, "curve": []}))
    calls: list = []
    monkeypatch.setattr(eval_runs, "diagnose", fake_diagnostics(calls))
    diagnose_runs(runs[:1], sweep, log=lambda line: None)  # mha's cached; mqa's never computed
    calls.clear()
    assert ablate_main(["--config", str(path), "--output", str(output), "--report-only"]) == 0
    assert calls == []
    section = (output / "results.md").read_text().split("## Diagnostics", 1)[1]
    assert (
        "| mha | 0.500 | 0.500 | 2,000.0 | 0.700 | 1/1 |" in section
        and "| mqa | – | – | – | – | 1/1 |" in section
    )
    assert "diag_sink_rate.png" in capsys.readouterr().out


# ------------------------------------------------------------------------------ evaluation after each run


def finished_runs(directory: Path, names=("good", "bad")) -> list:
    """Runs that look finished (summary and a checkpoint file), without training anything."""
    sweep = ablation.Sweep(
        base_text="model: {}\n", overrides={}, variants=[ablation.Variant(n, {}) for n in names]
    )
    runs = ablation.plan_runs(sweep, directory, seeds=1)
    for run in runs:
        (run.directory / "checkpoints").mkdir(parents=True)
        (run.directory / "checkpoints" / "best.ckpt").write_bytes(b"weights")
        (run.directory / ablation.SUMMARY_FILE).write_text(
            json.dumps({"block_size": 16, "best_val_loss": 2.0, "curve": []})
        )
    return runs


def test_evaluation_is_cached_per_run_and_a_failure_is_a_note(tmp_path, monkeypatch):
    calls = []

    def fake_evaluate(path, lengths=None, max_tokens=None, trust_kind_modules=False):
        calls.append((Path(path).parts[-3], tuple(lengths), max_tokens))
        if "bad-" in str(path):
            raise RuntimeError("out of\nmemory")
        return {
            "loss": 1.5,
            "perplexity": math.exp(1.5),
            "bits_per_char": 2.1,
            "tokens": 100,
            "by_length": {
                "16": {"loss": 1.5},
                "32": {"loss": 1.4},
                "64": {"skipped": "learned positions stop at 16"},
            },
            "task": {"exact_match": 0.25, "item_accuracy": 0.5},
        }

    monkeypatch.setattr(eval_runs, "evaluate_checkpoint", fake_evaluate)
    runs = finished_runs(tmp_path)
    settings = ablation.EvalSettings(max_tokens=500)
    eval_runs.evaluate_runs(runs, settings, log=lambda line: None)
    assert calls == [("good-seed1337", (16, 32, 64), 500), ("bad-seed1337", (16, 32, 64), 500)]

    sweep = ablation.Sweep(
        base_text="", overrides={}, variants=[r.variant for r in runs], evaluation=settings
    )
    ablation.write_results(runs, tmp_path, sweep=sweep)
    rows = {row["variant"]: row for row in read_rows(tmp_path)}
    good, bad = rows["good"], rows["bad"]
    assert (good["eval_loss"], good["eval_bits_per_char"], good["loss_at_32"], good["loss_at_64"]) == (
        "1.5",
        "2.1",
        "1.4",
        "",
    )
    assert (good["task_exact_match"], good["task_item_accuracy"]) == ("0.25", "0.5")
    assert good["eval_note"] == "loss @ 64: learned positions stop at 16"
    assert (
        bad["status"] == "ok"
        and bad["eval_note"] == "evaluation failed: out of memory"
        and bad["eval_loss"] == ""
    )
    table = (tmp_path / "results.md").read_text()
    assert "| task exact match |" in table and "(evaluation failed: out of memory)" in table
    assert "good: loss @ 64: learned positions stop at 16 (blank above)" in table

    # A rerun reads the cache; a failure is tried again; new settings are evaluated afresh.
    eval_runs.evaluate_runs(runs, settings, log=lambda line: None)
    assert [c[0] for c in calls[2:]] == ["bad-seed1337"]
    eval_runs.evaluate_runs(runs, ablation.EvalSettings(max_tokens=400, lengths=[8]), log=lambda line: None)
    assert calls[-2:] == [("good-seed1337", (8,), 400), ("bad-seed1337", (8,), 400)]


@pytest.mark.parametrize(
    "value,message",
    [
        ("yes", "use false"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"lengths": [16, "x"]}, "lengths"),
        ({"lenghts": [16]}, "lenghts"),
    ],
)
def test_bad_eval_settings_are_user_errors(tmp_path, value, message):
    with pytest.raises(UserError, match=message):
        ablation.load_sweep(write_sweep(tmp_path, [{"name": "a"}], eval=value))


def test_data_is_prepared_once_per_setting_before_the_runs_and_a_missing_file_fails_only_its_runs(tmp_path):
    from minitx.ablation.plan.commands import BASE_SNAPSHOT, plan_runs
    from minitx.ablation.plan.sweep import load_sweep
    from minitx.ablation.runs.runner import prepare_data

    variants = [
        {"name": "mha", "overrides": {"model.attention.kind": "mha"}},
        {"name": "mqa", "overrides": {"model.attention": {"kind": "mqa"}}},
        {
            "name": "lost",
            "overrides": {"data.train_files": str(tmp_path / "missing.txt")},
            "allow_budget_change": True,
        },
    ]
    sweep = load_sweep(write_sweep(tmp_path, variants))
    output = tmp_path / "out"
    output.mkdir()
    (output / BASE_SNAPSHOT).write_text(sweep.base_text)  # as run_sweep writes it
    runs = plan_runs(sweep, output, seeds=2)
    lines: list[str] = []
    prepare_data(runs, lines.append)
    ready = [line for line in lines if "data ready" in line]
    assert len(ready) == 1 and "files, char tokenizer" in ready[0], lines  # mha and mqa share it
    assert any("lost" in line and "missing.txt" in line for line in lines), lines
    assert len(list((tmp_path / "cache" / "prepared").glob("*/manifest.json"))) == 1
