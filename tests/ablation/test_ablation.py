"""The ablation command: a real sweep of tiny runs end to end, resuming, failures, the table maths."""

import csv
import json
import math
from pathlib import Path

import pytest
import yaml

from minitx import ablation
from minitx.ablation import budget, eval_runs
from minitx.cli import ablate_main
from minitx.errors import UserError
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
        for file in ("run.json", "evaluation.json")
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


def test_differences_beyond_the_seed_spread_are_marked():
    def rows(variant, losses, speed):
        return [
            dict(
                {key: None for key, *_ in ablation.COLUMNS},
                variant=variant,
                status="ok",
                error="",
                best_val_loss=loss,
                tokens_per_s=speed,
                curve=[],
                memory_kind=None,
                budget_changes="",
            )
            for loss in losses
        ]

    table = ablation.aggregate(
        [
            *rows("ref", [2.0, 2.2], 100.0),
            *rows("far", [2.6, 2.8], 50.0),
            *rows("near", [2.15, 2.35], 100.0),
            *rows("one", [3.0], 100.0),
        ]
    )
    text = ablation.markdown_table(table)
    lines = {line.split(" |")[0][2:]: line for line in text.splitlines() if line.startswith("| ")}
    # far: |2.7 - 2.1| = 0.6 > 0.141 + 0.141; near: 0.15 < 0.283; one seed has no spread to compare.
    assert "2.7000 ± 0.1414 * |" in lines["far"] and "*" not in lines["near"] and "*" not in lines["one"]
    assert (
        "*" not in lines["ref"] and "50 ± 0 |" in lines["far"]
    )  # costs are not marked, only losses and accuracies
    assert "std + std of ref" in text


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
    from minitx.ablation.runner import BASE_SNAPSHOT, plan_runs, prepare_data
    from minitx.ablation.sweep import load_sweep

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
