"""A plain sweep's report (no budget, lr_sweep or ladder) rebuilt from its results.csv alone
(`ablate --report-only --from-csv`, runs/plain_csv.py) and against another variant
(`--baseline`), from runs planted as a finished sweep leaves them: no test here trains."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from test_ablation import write_sweep

from minitx import ablation
from minitx.ablation.plan.sweep import load_sweep
from minitx.cli import ablate_main

LOSSES = {  # per variant, one final val loss per seed
    "a": [2.00, 2.01, 2.02],
    "b": [2.10, 2.11, 2.12],  # worse than a, tightly: significant after Holm
    "c": [2.00, 2.03, 1.99],  # a's level: no difference found
}
ARMS = [{"name": name, "overrides": {"model.attention.kind": "mha"}} for name in LOSSES]


@pytest.fixture(autouse=True)
def fewer_plots(monkeypatch):
    """The plots of every report are not what is tested here (loss_curves.png is: drawn)."""
    from minitx.ablation.report import plain_plots

    for name in ("cost_quality", "loss_vs_context", "diagnostic_bars"):
        monkeypatch.setattr(plain_plots, name, lambda *args: None)


@pytest.fixture
def finished(tmp_path) -> tuple[Path, Path]:
    """A plain sweep's file and its output with every run finished (summary.json, run.json)."""
    config = write_sweep(tmp_path, ARMS, seeds=3, eval=False)
    output = tmp_path / "sweep"
    for run in ablation.plan_runs(load_sweep(config), output, seeds=3):
        loss = LOSSES[run.variant.name][run.seed - 5]  # the sweep's seed is 5
        run.directory.mkdir(parents=True)
        summary = {"final_val_loss": loss, "best_val_loss": loss, "steps": 4, "curve": []}
        (run.directory / ablation.SUMMARY_FILE).write_text(json.dumps(summary))
        record = {"status": "ok", "variant": run.variant.name, "seed": run.seed, "command": run.command}
        (run.directory / "run.json").write_text(json.dumps(record))
    return config, output


def report(config: Path, output: Path, *more: str) -> str:
    ablation.main(["--config", str(config), "--output", str(output), "--report-only", *more])
    return (output / "results.md").read_text(encoding="utf-8")


def without_source(text: str) -> list[str]:
    """results.md but the line that says where its figures came from."""
    return [line for line in text.splitlines() if "not from the runs" not in line]


def test_the_report_from_its_csv_is_the_report_from_its_runs(finished, tmp_path):
    config, output = finished
    from_runs = report(config, output)
    rebuilt = report(config, tmp_path / "rebuilt", "--from-csv", str(output / "results.csv"))
    assert without_source(rebuilt) == without_source(from_runs)
    assert f"- read from {output / 'results.csv'} (9 rows), not from the runs" in rebuilt
    assert not (tmp_path / "rebuilt" / "runs").exists()
    assert not (tmp_path / "rebuilt" / "loss_curves.png").exists()  # a CSV holds no curve
    with open(tmp_path / "rebuilt" / "results.csv", encoding="utf-8", newline="") as handle:
        assert [row["final_val_loss"] for row in csv.DictReader(handle)] == [
            str(loss) for losses in LOSSES.values() for loss in losses
        ]
    # the verdicts, in words beside their intervals
    rows = {line.split("|")[1].strip(): line for line in from_runs.splitlines() if line.startswith("| ")}
    assert rows["b"].rstrip(" |").endswith("worse") and rows["c"].rstrip(" |").endswith("no difference found")


def test_baseline_makes_another_variant_the_reference_from_runs_or_a_csv(finished, tmp_path):
    config, output = finished
    from_runs = report(config, output, "--baseline", "b")
    rebuilt = report(
        config, tmp_path / "rebuilt", "--from-csv", str(output / "results.csv"), "--baseline", "b"
    )
    for text in (from_runs, rebuilt):
        section = text.split("## Differences from b", 1)[1].split("\n## ", 1)[0]
        rows = {line.split("|")[1].strip(): line for line in section.splitlines() if line.startswith("| ")}
        assert set(rows) == {"variant", "a", "c"}  # b is the reference now
        assert "**-0.1000 [" in rows["a"] and rows["a"].rstrip(" |").endswith("better")


def test_only_some_variants_of_the_csv(finished, tmp_path):
    config, output = finished
    report(config, output)
    text = report(config, tmp_path / "rebuilt", "--from-csv", str(output / "results.csv"), "--only", "a,c")
    assert "(6 rows; 3 more, of variants --only left out)" in text
    assert "| b |" not in text and "## Differences from a" in text


def one_line_refusal(argv: list[str], capsys) -> str:
    assert ablate_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ablate: error: ") and "\n" not in err and "Traceback" not in err
    return err


def edited(path: Path, change) -> Path:
    with open(path, encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        columns, rows = list(reader.fieldnames or []), list(reader)
    columns, rows = change(columns, rows)
    changed = path.parent.parent / "changed.csv"
    with open(changed, "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return changed


def cell(index: int, column: str, value: str):
    def change(columns, rows):
        rows[index][column] = value
        return columns, rows

    return change


@pytest.mark.parametrize(
    "change, expected",
    [
        (cell(0, "variant", "bb"), "line 2: variant 'bb' is not a variant of the config (did you mean b?)"),
        (cell(4, "final_val_loss", "2.1x"), "line 6 (b-seed6): final_val_loss '2.1x' is not a finite number"),
        (cell(2, "status", "done"), "status 'done' is not one of ok, failed, cancelled, not run"),
        (cell(1, "seed", "5"), "lines 2 and 3 are both a seed 5; keep one row per run"),
        (lambda c, r: ([x for x in c if x != "seed"], r), "has no column seed; a plain sweep's results.csv has"),
        (lambda c, r: (c, [x for x in r if x["variant"] != "c"]), "no row of variant(s) c of the config; add --only a,b"),
        (lambda c, r: (["arm", *c], r), None),  # a designed sweep's column beside: still a plain CSV
    ],
)  # fmt: skip
def test_a_csv_that_does_not_fit_the_plain_sweep_is_refused_in_one_line(
    finished, tmp_path, capsys, change, expected
):
    config, output = finished
    report(config, output)
    path = edited(output / "results.csv", change)
    target = tmp_path / "rebuilt"
    argv = ["--config", str(config), "--output", str(target), "--report-only", "--from-csv", str(path)]
    if expected is None:
        assert ablate_main(argv) == 0
        return
    assert expected in one_line_refusal(argv, capsys)
    assert not target.exists()  # nothing written, not even the folder


def test_a_row_with_more_cells_than_the_header_is_refused_in_one_line(finished, tmp_path, capsys):
    config, output = finished
    report(config, output)
    lines = (output / "results.csv").read_text(encoding="utf-8").splitlines()
    lines[1] += ",surplus"
    path = tmp_path / "longer.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = [
        "--config",
        str(config),
        "--output",
        str(tmp_path / "o"),
        "--report-only",
        "--from-csv",
        str(path),
    ]
    assert f"{path}: line 2 has more cells than the header; fix the row" in one_line_refusal(argv, capsys)
    assert not (tmp_path / "o").exists()


def test_a_designed_sweeps_csv_for_a_plain_config_and_the_other_way_round(finished, tmp_path, capsys):
    config, output = finished
    report(config, output)
    root = Path(__file__).resolve().parents[2]
    showcase = root / "docs" / "results" / "ladder" / "results.csv"
    argv = ["--config", str(config), "--output", str(tmp_path / "o"), "--report-only", "--from-csv"]
    assert "is a designed sweep's results.csv (an arm column)" in one_line_refusal(
        [*argv, str(showcase)], capsys
    )
    ladder = ["--config", str(root / "configs" / "ablation_ladder.yaml"), *argv[2:]]
    refused = one_line_refusal([*ladder, str(output / "results.csv")], capsys)
    assert "is a plain sweep's results.csv (a variant column, no arm)" in refused
    assert not (tmp_path / "o").exists()
