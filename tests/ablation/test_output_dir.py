"""Whose an --output is: another sweep there is refused in one line (naming another --output and
--force), the same sweep resumes, --force replaces the earlier sweep's files and nothing else, and
an output written before sweep.json existed is judged by what it holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from minitx.ablation.output import SWEEP_FILE, check_output, sweep_identity
from minitx.ablation.plan.commands import make_run
from minitx.ablation.plan.sweep import load_sweep
from minitx.cli import ablate_main

TINY_MODEL = {"n_layer": 1, "n_head": 2, "d_model": 16, "block_size": 16, "lr": 1e-2, "warmup_steps": 1}


def write_sweep(directory: Path, name: str = "sweep.yaml", variants=None, **changes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    text = directory / "corpus.txt"
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
                "cache_dir": str(directory / "cache"),
            },
            "trainer": {"max_steps": 2, "val_check_interval": 2, "accelerator": "cpu", "devices": 1},
        },
        "seed": 5,
        "eval": False,
        "variants": variants or [{"name": "mha", "overrides": {"model.attention.kind": "mha"}}],
        **changes,
    }
    path = directory / name
    path.write_text(yaml.safe_dump(sweep), encoding="utf-8")
    return path


def refusal(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.slow  # 9-24 s of real runs: the fast suite within its minutes (issue 62)
def test_a_sweep_into_another_sweeps_output_is_refused_the_same_resumes_and_force_replaces(tmp_path, capsys):
    output = tmp_path / "sweep1"
    first = write_sweep(tmp_path, "my_ladder.yaml")
    assert ablate_main(["--config", str(first), "--output", str(output)]) == 0
    (output / "notes.txt").write_text("mine")  # the user's own file: never the sweep's to remove
    (output / "lr_sweep.png").write_bytes(b"an earlier designed sweep's plot")
    written = {p: p.stat().st_mtime_ns for p in output.rglob("*") if p.is_file()}

    # Another sweep (another arm) into it: one line, the way out, nothing trained or written.
    other = write_sweep(
        tmp_path, "ablation.yaml", variants=[{"name": "mqa", "overrides": {"model.attention.kind": "mqa"}}]
    )
    capsys.readouterr()
    assert ablate_main(["--config", str(other), "--output", str(output)]) == 2
    err = refusal(capsys)
    assert err == (
        f"ablate: error: --output: {str(output)!r} holds another sweep ({first}): other arms: mha, where this "
        "one has mqa; give another --output, or add --force to replace it (removes its results, plots, plan and runs first)"
    )
    assert {p: p.stat().st_mtime_ns for p in output.rglob("*") if p.is_file()} == written
    # --dry-run says the same; with --force it says what it would remove, and removes nothing.
    assert ablate_main(["--config", str(other), "--output", str(output), "--dry-run"]) == 2
    assert "holds another sweep" in refusal(capsys)
    assert ablate_main(["--config", str(other), "--output", str(output), "--dry-run", "--force"]) == 0
    said = capsys.readouterr().out
    assert (
        f"# --force: would remove the sweep in {output} first "
        "(results.md, results.csv, base_config.yaml, sweep.json, 1 run, 4 plots)" in said
    )
    assert {p: p.stat().st_mtime_ns for p in output.rglob("*") if p.is_file()} == written

    # As an output written before sweep.json existed (this one without it): the same answers, from
    # the runs it holds; the same sweep (its file renamed, --only) resumes and records sweep.json.
    (output / SWEEP_FILE).unlink()
    assert ablate_main(["--config", str(other), "--output", str(output)]) == 2
    assert (
        "holds another sweep: other arms: a run of 'mha' (mha-seed5), where this one has mqa; give"
        in refusal(capsys)
    )
    same = tmp_path / "renamed.yaml"
    same.write_text(first.read_text())
    assert ablate_main(["--config", str(same), "--output", str(output), "--only", "mha"]) == 0
    assert "ablate: skip   mha seed 5 (finished)" in capsys.readouterr().out
    assert json.loads((output / SWEEP_FILE).read_text())["config"] == str(same)

    # --force replaces it: the earlier sweep's files go (its plots, runs), the user's file stays.
    assert ablate_main(["--config", str(other), "--output", str(output), "--force"]) == 0
    said = capsys.readouterr().out
    assert f"ablate: --force: removed the sweep in {output} (" in said and "start  mqa seed 5" in said
    assert sorted(p.name for p in (output / "runs").iterdir()) == ["mqa-seed5"]
    assert not (output / "lr_sweep.png").exists() and (output / "notes.txt").read_text() == "mine"
    assert json.loads((output / SWEEP_FILE).read_text())["config"] == str(other)
    assert (
        "| mqa |" in (output / "results.md").read_text() and "mha" not in (output / "results.csv").read_text()
    )


@pytest.mark.parametrize(
    "change,said",
    [
        ({"overrides": {"trainer.max_steps": 3}}, "another base config or shared overrides"),
        ({"seed": 9}, "another plan: its seed, match"),
        ({"variants": [{"name": "mha", "overrides": {"model.attention.kind": "mqa"}}]}, "variant 'mha' made with different settings"),
    ],
)  # fmt: skip
def test_each_difference_of_a_sweep_is_named(tmp_path, capsys, change, said):
    output = tmp_path / "out"
    earlier = write_sweep(tmp_path, "a.yaml")
    identity = sweep_identity(load_sweep(earlier), earlier, [])
    output.mkdir()
    (output / SWEEP_FILE).write_text(json.dumps(identity.record()))
    (output / "results.md").write_text("# an earlier sweep\n")
    now = write_sweep(tmp_path, "b.yaml", **change)
    assert ablate_main(["--config", str(now), "--output", str(output), "--dry-run"]) == 2
    err = refusal(capsys)
    assert said in err and "give another --output, or add --force" in err
    # Other training arguments after `--` are another sweep too; the same ones are not.
    assert ablate_main(["--config", str(earlier), "--output", str(output), "--dry-run"]) == 0
    assert ablate_main(["--config", str(earlier), "--output", str(output), "--dry-run", "--", "--model.dropout", "0.1"]) == 2  # fmt: skip
    assert "other training arguments after --" in refusal(capsys)


def test_an_output_written_before_sweep_json_resumes_or_is_refused_by_what_it_holds(tmp_path, capsys):
    path = write_sweep(tmp_path)
    sweep = load_sweep(path)
    identity = sweep_identity(sweep, path, [])
    output = tmp_path / "old"
    run = make_run(sweep, sweep.variants[0], 5, output, [])
    run.directory.mkdir(parents=True)
    (run.directory / "run.json").write_text(
        json.dumps({"variant": "mha", "seed": 5, "fingerprint": run.fingerprint})
    )
    (output / "base_config.yaml").write_text(sweep.base_text)
    (output / "results.md").write_text("# an older minitx's table\n")
    check_output(output, identity, sweep, [])  # its own runs: resumed, not refused
    assert ablate_main(["--config", str(path), "--output", str(output), "--dry-run"]) == 0
    capsys.readouterr()

    for what, said in [
        (lambda: (output / "plan.json").write_text('{"version": 2}'), "a designed sweep (its plan.json)"),
        (lambda: (output / "base_config.yaml").write_text("model: {}\n"), "another base config"),
        (lambda: (output / "runs" / "gqa-seed5").mkdir() or (output / "runs" / "gqa-seed5" / "run.json").write_text('{"variant": "gqa"}'),
         "other arms: a run of 'gqa' (gqa-seed5)"),
        (lambda: (run.directory / "run.json").write_text('{"variant": "mha", "fingerprint": "0123"}'),
         "variant 'mha' made with different settings (mha-seed5)"),
    ]:  # fmt: skip
        saved = {p: p.read_bytes() for p in output.rglob("*") if p.is_file()}
        what()
        assert ablate_main(["--config", str(path), "--output", str(output), "--dry-run"]) == 2
        err = refusal(capsys)
        assert f"holds another sweep: {said}" in err and "--force" in err
        for p in list(output.rglob("*")):  # back to the sweep's own output
            if p.is_file() and p not in saved:
                p.unlink()
        for p, data in saved.items():
            p.write_bytes(data)


def test_force_is_refused_with_report_only_and_leaves_the_output_alone(tmp_path, capsys):
    path = write_sweep(tmp_path)
    output = tmp_path / "out"
    output.mkdir()
    (output / "results.md").write_text("kept")
    assert ablate_main(["--config", str(path), "--output", str(output), "--report-only", "--force"]) == 2
    assert refusal(capsys).startswith("ablate: error: --force: replaces the sweep in --output")
    assert (output / "results.md").read_text() == "kept"
