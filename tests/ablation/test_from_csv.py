"""`ablate --report-only --from-csv FILE`: a designed sweep's report rebuilt from its results.csv
alone (runs/from_csv.py), the recorded showcase (docs/results/ladder/) as the known answer."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import pytest

from minitx import ablation
from minitx.ablation.analysis import fit
from minitx.ablation.plan.ladder import make_plan
from minitx.ablation.plan.sweep import load_sweep
from minitx.ablation.report.designed import CSV_FIELDS
from minitx.ablation.runs import from_csv
from minitx.cli import ablate_main
from minitx.errors import UserError
from minitx.evaluation.diagnostics import DIAGNOSTICS

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "ablation_ladder.yaml")
RECORDED = ROOT / "docs" / "results" / "ladder"
SHOWCASE_CSV = RECORDED / "results.csv"


@pytest.fixture(autouse=True)
def fewer_draws(monkeypatch):
    """The intervals' width is not what is tested here: fewer bootstrap refits, the same tables."""
    monkeypatch.setattr(fit, "BOOTSTRAP", 20)


def read_showcase() -> tuple[list[str], list[dict]]:
    with open(SHOWCASE_CSV, encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def write_csv(path: Path, columns: list[str], rows: list[dict]) -> Path:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    path.write_text(out.getvalue(), encoding="utf-8")
    return path


def rebuild(csv_path: Path, output: Path, *more: str) -> str:
    ablation.main(
        ["--config", CONFIG, "--report-only", "--from-csv", str(csv_path), "--output", str(output), *more]
    )
    return (output / "results.md").read_text(encoding="utf-8")


def losses_table(text: str) -> dict[tuple[str, str], str]:
    """The per-point final val loss table of a results.md: (row, arm) -> cell."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Final val loss per point"))
    table = []
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            table.append([cell.strip() for cell in line.strip("|").split("|")])
        elif table:
            break
    arms = table[0][1:]
    return {(row[0], arm): cell for row in table[2:] for arm, cell in zip(arms, row[1:])}


@pytest.mark.slow  # the whole showcase (222 runs) analysed and reported: about 6 s
def test_the_recorded_showcase_rebuilt_from_its_csv_alone(tmp_path):
    """The same losses table as the recorded results.md, to the CSV's five decimals (a loss that
    the CSV rounded to ...5 may round the other way at four), no run directory needed or made."""
    output = tmp_path / "rebuilt"
    text = rebuild(SHOWCASE_CSV, output)
    recorded = losses_table((RECORDED / "results.md").read_text(encoding="utf-8"))
    rebuilt = losses_table(text)
    assert sorted(rebuilt) == sorted(recorded) and len(rebuilt) == 8 * (4 + 4 * 3)
    for key, cell in recorded.items():
        assert same_cell(rebuilt[key], cell), (key, cell, rebuilt[key])
    assert "Baseline: **mha**" in text
    assert f"read from {SHOWCASE_CSV} (222 rows), not from the runs" in text
    assert not (output / "runs").exists()
    assert all((output / name).is_file() for name in ("results.csv", "lr_sweep.png", "loss_vs_compute.png"))
    # results.csv rewritten from the rows as the plan read them: the same runs and figures
    _, rows = read_showcase()
    with open(output / "results.csv", encoding="utf-8", newline="") as handle:
        written = {Path(r["run_dir"]).name: r for r in csv.DictReader(handle)}
    dropped = [Path(r["run_dir"]).name for r in rows if Path(r["run_dir"]).name not in written]
    if dropped:  # runs today's rate rule does not plan (sweep or confirmation): listed, not read
        assert f"{len(dropped)} row(s) of the CSV are no run of the plan" in text
        assert all(name in text for name in dropped[:6])
    for row in rows:
        again = written.get(Path(row["run_dir"]).name)
        for column in ("arm", "size", "multiplier", "seed", "status", "steps", "flops", "final_val_loss"):
            assert again is None or again[column] == row[column], (row["run_dir"], column)


def same_cell(rebuilt: str, recorded: str) -> bool:
    """A loss cell as recorded, to the CSV's rounding; any other cell exactly."""
    found = re.fullmatch(r"([0-9.]+)( ᵇ| ᵐ)?", rebuilt), re.fullmatch(r"([0-9.]+)( ᵇ| ᵐ)?", recorded)
    if None in found:
        return rebuilt == recorded
    return (
        found[0].group(2) == found[1].group(2) and abs(float(found[0][1]) - float(found[1][1])) <= 1.00001e-4
    )


@pytest.mark.slow  # the whole showcase (222 runs) analysed and reported: about 6 s
def test_baseline_gqa_and_the_rates_the_csv_recorded(tmp_path, monkeypatch):
    """--baseline gqa makes gqa the baseline. gqa's ladder moved to x3 at every size (its runs
    renamed with it): the plan reads those runs, not the ones today's rule asks for, and the
    notes say so (one rebuild for both: each takes seconds)."""
    from minitx.ablation.report import designed_plots

    monkeypatch.setattr(designed_plots, "draw_all", lambda *args: None)  # the plots: the test above
    columns, rows = read_showcase()
    for row in rows:
        if row["arm"] == "gqa" and row["role"] in ("ladder", "branch", "seed"):
            old = f"-lr{row['multiplier']}-"
            row["multiplier"] = "3"
            row["run_dir"] = row["run_dir"].replace(old, "-lr3-")
            row["branch_of"] = row["branch_of"].replace(old, "-lr3-")
    moved = write_csv(tmp_path / "moved.csv", columns, rows)
    text = rebuild(moved, tmp_path / "out", "--baseline", "gqa")
    assert "Baseline: **gqa**" in text and "Baseline: **mha**" not in text
    assert re.search(r"^\| gqa \| [^\n]*\| 1 \(baseline\) \|", text, re.M)
    assert not re.search(r"^\| mha \| [^\n]*\| 1 \(baseline\) \|", text, re.M)
    assert "## Seeds: differences from gqa" in text
    # what the runs were sized by stays the file's first variant's
    assert "- budgets: tokens per non-embedding parameter of mha at each size" in text
    assert "each arm's MLP width set to mha's budget at each size" in text
    # the losses are the CSV's whatever the baseline and the rates: gqa's column first
    header = next(line for line in text.splitlines() if line.startswith("| size |"))
    assert header.startswith("| size | gqa | mha | local |")
    table = losses_table(text)
    recorded = losses_table((RECORDED / "results.md").read_text(encoding="utf-8"))
    assert all(same_cell(table[key], cell) for key, cell in recorded.items())
    assert table["d48 @ 20 tokens/param", "gqa"] == "1.8739"  # found at x3, the rate recorded
    assert (
        "- gqa: the ladder's rates as the CSV recorded them, x3, x3, x3, x3 at d32, d40, d48, d64; " in text
    )
    assert "rerun the sweep to apply it" in text
    assert "x3, x3, x3, x3 |" in text  # used at each size, in the rates table
    assert "- mha: the ladder's rates" not in text  # as recorded where the rule agrees: no note


def one_line_refusal(argv: list[str], capsys) -> str:
    assert ablate_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ablate: error: ") and "\n" not in err and "Traceback" not in err
    return err


def showcase_with(tmp_path: Path, change) -> Path:
    columns, rows = read_showcase()
    columns, rows = change(columns, rows)
    return write_csv(tmp_path / "changed.csv", columns, rows)


def drop_column(name):
    return lambda columns, rows: ([c for c in columns if c != name], rows)


def set_cell(run: str, column: str, value: str):
    def change(columns, rows):
        for row in rows:
            if row["run_dir"].endswith("/" + run):
                row[column] = value
        return columns, rows

    return change


def rename_arm(old: str, new: str):
    def change(columns, rows):
        for row in rows:
            if row["arm"] == old:
                row["arm"], row["run_dir"] = new, row["run_dir"].replace(f"/{old}-", f"/{new}-")
        return columns, rows

    return change


def without_arm(arm: str):
    return lambda columns, rows: (columns, [r for r in rows if r["arm"] != arm])


@pytest.mark.parametrize(
    "change, extra, expected",
    [
        (None, ["--baseline", "gqa"], "--baseline: only with --report-only"),
        (
            None,
            ["--report-only", "--from-csv", "FILE", "--baseline", "gqaa"],
            "unknown arm 'gqaa' (did you mean gqa?)",
        ),
        (None, ["--report-only", "--from-csv", "missing.csv"], "--from-csv: file 'missing.csv' not found"),
        (drop_column("final_val_loss"), [], "has no column final_val_loss"),
        (
            set_cell("gqa-d40-lr3.2-seed1338", "final_val_loss", "1.9x"),
            [],
            "line 90 (gqa-d40-lr3.2-seed1338): final_val_loss '1.9x' is not a finite number",
        ),
        (set_cell("mha-d32-lr1-seed1337", "steps", "many"), [], "(mha-d32-lr1-seed1337): steps 'many'"),
        (rename_arm("gqa", "gqa2"), [], "arm 'gqa2' is not a variant of the config (did you mean gqa?)"),
        (set_cell("mha-d64-lr2-seed1337", "size", "d80"), [], "size 'd80' is not one of the config's"),
        (set_cell("mha-d64-lr2-seed1337", "budget", "40"), [], "budget '40' is not one of the config's"),
        (without_arm("gated"), [], "has no row of arm(s) gated of the config; add --only mha,gqa,local,mta"),
        (set_cell("mha-d32-lr1-seed1337", "status", "done"), [], "status 'done' is not one of ok, failed"),
    ],
)
def test_a_csv_or_command_line_that_does_not_fit_is_refused_in_one_line(
    tmp_path, capsys, change, extra, expected
):
    """Refused before the plan is made (what the sweep file alone can tell), nothing written."""
    path = showcase_with(tmp_path, change) if change else SHOWCASE_CSV
    output = tmp_path / "out"
    argv = ["--config", CONFIG, "--output", str(output)]
    argv += (
        [str(path) if a == "FILE" else a for a in extra]
        if extra
        else ["--report-only", "--from-csv", str(path)]
    )
    assert expected in one_line_refusal(argv, capsys)
    assert not output.exists()  # nothing written, not even the folder


def test_the_output_folder_is_refused_where_the_report_would_overwrite_what_it_reads(tmp_path, capsys):
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "results.csv").write_bytes(SHOWCASE_CSV.read_bytes())
    argv = ["--config", CONFIG, "--report-only", "--from-csv", str(copy / "results.csv")]
    assert "the CSV being read" in one_line_refusal([*argv, "--output", str(copy)], capsys)
    sweep = tmp_path / "sweep"
    (sweep / "runs" / "mha-d32-lr1-seed1337").mkdir(parents=True)
    (sweep / "runs" / "mha-d32-lr1-seed1337" / "summary.json").write_text("{}")
    assert "holds a sweep's runs" in one_line_refusal([*argv, "--output", str(sweep)], capsys)
    assert "--from-csv: give --output DIR" in one_line_refusal(argv, capsys)
    plain = str(ROOT / "configs" / "ablation.yaml")  # no budget, lr_sweep or ladder: a plain sweep's CSV
    refused = one_line_refusal(["--config", plain, *argv[2:], "--output", str(tmp_path / "o")], capsys)
    assert "is a designed sweep's results.csv (an arm column), and the config has no budget" in refused


def older_ladder_seed(columns, rows):
    """The ladder at the sweep's own seed, as an earlier minitx planned it."""
    kept: dict[str, dict] = {}
    for row in rows:  # its ladder run at the smallest size was the sweep's run there
        if row["seed"] == "1338":
            row["seed"], row["run_dir"] = "1337", row["run_dir"].replace("-seed1338", "-seed1337")
        kept.setdefault(row["run_dir"], row)
    return columns, list(kept.values())


def cut_ladder(columns, rows):
    """gqa's ladder without its d40 run (nor its branches)."""
    return columns, [
        r for r in rows if not (r["arm"] == "gqa" and r["size"] == "d40" and r["seed"] == "1338")
    ]


def twin_ladder(columns, rows):
    """gqa's d40 ladder run twice, at two rates."""
    twin = dict(next(r for r in rows if r["run_dir"].endswith("/gqa-d40-lr3.2-seed1338")))
    twin["multiplier"], twin["run_dir"] = "5", twin["run_dir"].replace("-lr3.2-", "-lr5-")
    return columns, [*rows, twin]


def other_params(columns, rows):
    for row in rows:
        if row["arm"] == "local" and row["size"] == "d48":
            row["params"] = str(int(row["params"]) + 64)
    return columns, rows


def wrong_arm(columns, rows):
    return set_cell("mha-d48-lr2.67-b5-seed1338", "arm", "local")(columns, rows)


@pytest.fixture(scope="module")
def showcase_plan(tmp_path_factory):
    return make_plan(load_sweep(CONFIG), tmp_path_factory.mktemp("plan"))


@pytest.mark.parametrize(
    "change, expected",
    [
        (older_ladder_seed, "its ladder runs have seed(s) 1337, 1339, 1340, not 1338 (the file's seed + 1)"),
        (cut_ladder, "gqa's ladder runs (seed 1338) hold no row at d40"),
        (twin_ladder, "are both gqa's ladder run at d40 (x3.2, x5)"),
        (other_params, "local at d48 has 55,600 parameters, the config's 55,536"),
        (wrong_arm, "(mha-d48-lr2.67-b5-seed1338): arm local at d48, but its run's name is mha's at d48"),
        (set_cell("mla-d64-lr2-seed1338", "steps", "9999"), "(mla-d64-lr2-seed1338): trained 9999 steps"),
    ],
)
def test_a_csv_made_by_another_plan_is_refused_in_one_line(tmp_path, showcase_plan, change, expected):
    """What only the plan can tell (its ladder seed, parameters, steps), as run_designed reads it."""
    path = showcase_with(tmp_path, change)
    showcase_plan.recorded_rates = {}
    with pytest.raises(UserError) as caught:
        results = from_csv.read_results(path, showcase_plan)
        results.check(sum(showcase_plan.all_points(results), []))
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_a_refusal_after_the_plan_leaves_nothing_written(tmp_path, capsys):
    output = tmp_path / "out"
    path = showcase_with(tmp_path, set_cell("mla-d64-lr2-seed1338", "steps", "9999"))
    argv = ["--config", CONFIG, "--report-only", "--from-csv", str(path), "--output", str(output)]
    assert "trained 9999 steps, where the config plans 1874 by the same FLOP count" in one_line_refusal(
        argv, capsys
    )
    assert not output.exists()


def test_diagnostic_columns_are_optional_and_checked_when_there(tmp_path):
    path = showcase_with(tmp_path, lambda c, r: ([x for x in c if x not in DIAGNOSTICS], r))
    rows = from_csv.read_rows(path)
    assert len(rows) == 222 and all(row.diagnostics is None for row in rows)
    bad = showcase_with(tmp_path, set_cell("mha-d32-lr1-seed1337", "entropy", "high"))
    with pytest.raises(
        UserError, match=r"line 4 \(mha-d32-lr1-seed1337\): entropy 'high' is not a finite number"
    ):
        from_csv.read_rows(bad)


# A cell out of its column's range (from_csv.RANGES), each column at least once: in mha's first
# sweep run (line 4 of the showcase), refused by ablate in one line naming the line, the run, the
# column and the range. The diagnostics and tokens, flops_per_token are optional: checked when there.
RUN = "mha-d32-lr1-seed1337"
OUT_OF_RANGE = [
    ("multiplier", "0", "is not a finite number > 0 (the learning rate's multiplier)"),
    ("multiplier", "-2", "is not a finite number > 0"),
    ("seed", "-1", "is not a whole number from 0 to 4294967295 (a training seed)"),
    ("seed", "1337.5", "is not a whole number from 0 to 4294967295"),
    ("seed", "4294967296", "is not a whole number from 0 to 4294967295"),
    ("steps", "0", "is not a whole number > 0 (steps trained)"),
    ("steps", "-100", "is not a whole number > 0"),
    ("tokens", "0", "is not a whole number > 0 (tokens trained on)"),
    ("tokens", "-4096", "is not a whole number > 0"),
    ("flops", "-5", "is not a finite number > 0 (the training FLOPs)"),
    ("flops", "0", "is not a finite number > 0"),
    ("params", "0", "is not a whole number > 0 (the model's parameters)"),
    ("params", "24722.5", "is not a whole number > 0"),
    ("flops_per_token", "-172896", "is not a finite number > 0 (the model's FLOPs per token)"),
    ("final_val_loss", "-1.5", "is not a finite number >= 0 (a cross-entropy)"),
    ("final_val_loss", "inf", "is not a finite number >= 0"),
    ("first_token_share", "nan", "is not a finite number (the mean attention on key 0)"),
    ("sink_rate", "1.5", "is not a finite number from 0 to 1 (a share of heads)"),
    ("sink_rate", "-0.125", "is not a finite number from 0 to 1"),
    (
        "massive_ratio",
        "0.5",
        "is not a finite number >= 1 (the largest |activation| over the mean median one)",
    ),
    ("entropy", "-0.01", "is not a finite number >= 0 (a normalised attention entropy)"),
]


@pytest.mark.parametrize(
    "column, value, expected", OUT_OF_RANGE, ids=[f"{c}={v}" for c, v, _ in OUT_OF_RANGE]
)
def test_a_number_outside_its_columns_range_is_refused_in_one_line_with_nothing_written(
    tmp_path, capsys, column, value, expected
):
    path = showcase_with(tmp_path, set_cell(RUN, column, value))
    output = tmp_path / "out"
    argv = ["--config", CONFIG, "--report-only", "--from-csv", str(path), "--output", str(output)]
    refused = one_line_refusal(argv, capsys)  # exit status 2, one line
    assert (
        f"{path}: line 4 ({RUN}): {column} {value!r} {expected}" in refused
        and "fix or remove the row" in refused
    )
    assert not output.exists()  # nothing written, not even the folder


def test_every_numeric_column_has_its_range_and_a_test_out_of_it():
    words = ("arm", "size", "budget", "role", "status", "error", "flop_convention", "branch_of", "device")
    numeric = [c for c in CSV_FIELDS if c not in (*words, "run_dir")]  # budget: one of the config's
    assert list(from_csv.RANGES) == numeric  # in one place, in the file's order
    assert {column for column, _, _ in OUT_OF_RANGE} == set(from_csv.RANGES)


def set_cells(run: str, **values: str):
    def change(columns, rows):
        for column, value in values.items():
            set_cell(run, column, value)(columns, rows)
        return columns, rows

    return change


def test_the_ends_of_each_range_are_accepted_and_a_run_not_ok_is_checked_where_written(tmp_path):
    ends = set_cells(
        RUN, multiplier="1e-9", seed="0", final_val_loss="0", tokens="", flops_per_token="",
        first_token_share="-0.5", sink_rate="1", massive_ratio="1", entropy="0",
    )  # fmt: skip
    row = next(row for row in from_csv.read_rows(showcase_with(tmp_path, ends)) if row.name == RUN)
    assert (row.multiplier, row.seed, row.loss) == (1e-9, 0, 0.0)
    assert row.diagnostics == {"first_token_share": -0.5, "sink_rate": 1, "massive_ratio": 1, "entropy": 0}
    # A failed run has no loss and counts the plan's FLOPs: blank cells pass, a written one is checked.
    failed = set_cells(RUN, status="failed", final_val_loss="", flops="")
    row = next(row for row in from_csv.read_rows(showcase_with(tmp_path, failed)) if row.name == RUN)
    assert row.status == "failed" and row.loss is None and row.flops is None
    bad = showcase_with(tmp_path, set_cells(RUN, status="failed", flops="-5"))
    with pytest.raises(UserError, match=rf"line 4 \({RUN}\): flops '-5' is not a finite number > 0"):
        from_csv.read_rows(bad)


SMALL = f"""base: {ROOT / "configs" / "default.yaml"}
overrides:
  model.optimizer: adamw
  model.n_layer: 1
  model.n_head: 2
  model.block_size: 32
  model.warmup_steps: 2
  data.batch_size: 4
  data.val_batches: 2
  trainer.val_check_interval: 1000
  run.checkpoint_every_n_steps: 0
seed: 1
seeds: 3
eval: false
lr_sweep: {{multipliers: [0.5, 1, 2]}}
ladder:
  sizes:
    - {{name: d16, overrides: {{model.d_model: 16}}}}
    - {{name: d24, overrides: {{model.d_model: 24}}}}
    - {{name: d32, overrides: {{model.d_model: 32}}}}
  budgets: {{tokens_per_param: [1, 2]}}
seeds_at: {{size: d24, budget: 2}}
variants:
  - {{name: mha, overrides: {{model.attention.kind: mha}}}}
  - {{name: twin, overrides: {{model.attention.kind: mha}}}}
  - {{name: handicap, overrides: {{model.attention.kind: mha}}}}
"""


def plant_runs(plan) -> None:
    """Every run the plan asks for, as a finished run leaves it (one failed), phase by phase."""
    import json
    import math

    from minitx.ablation.runs.results import RunResults

    plan.output.mkdir(parents=True, exist_ok=True)
    (plan.output / "plan.json").write_text(json.dumps({"version": 2}))
    best = {"mha": 1.0, "twin": 1.0, "handicap": 2.0}
    while True:
        todo = [
            p for p in sum(plan.all_points(RunResults()), []) if not (p.run.directory / "run.json").is_file()
        ]
        if not todo:
            return
        for p in todo:
            p.run.directory.mkdir(parents=True, exist_ok=True)
            failed = p.arm == "twin" and p.size == "d16" and p.budget == 1
            record = {"status": "failed", "error": "planted failure"} if failed else {"status": "ok"}
            (p.run.directory / "run.json").write_text(json.dumps(record))
            if failed:
                continue
            scale = 0.5 if p.arm == "handicap" else 1.0
            loss = (
                1.5
                + 2.0 * (p.flops * scale / 1e9) ** -0.3
                + 0.05 * math.log2(p.multiplier / best[p.arm]) ** 2
            )
            loss += 0.003 * ((p.seed * 7 + len(p.run.directory.name)) % 5)
            summary = {"steps": p.steps, "final_val_loss": loss, "flop_convention": "minitx-flops/2"}
            (p.run.directory / "summary.json").write_text(json.dumps(summary))


def test_a_report_from_its_csv_is_the_report_from_its_runs(tmp_path, monkeypatch):
    """A small ladder planted on disk (a failed branch among its runs): --report-only from the runs,
    then from the results.csv it wrote, into a folder without runs, both against another baseline:
    the same results.md but for the note that says where the figures came from."""
    from minitx.ablation.report import designed_plots

    monkeypatch.setattr(designed_plots, "draw_all", lambda *args: None)
    config = tmp_path / "sweep.yaml"
    config.write_text(SMALL, encoding="utf-8")
    from_runs = tmp_path / "runs_out"
    plant_runs(make_plan(load_sweep(config), from_runs))
    ablation.main(
        ["--config", str(config), "--output", str(from_runs), "--report-only", "--baseline", "twin"]
    )
    first = (from_runs / "results.md").read_text(encoding="utf-8")
    assert "planted failure" in first and "Baseline: **twin**" in first  # --baseline of runs on disk too
    again = tmp_path / "csv_out"
    argv = ["--config", str(config), "--report-only", "--from-csv", str(from_runs / "results.csv")]
    ablation.main([*argv, "--output", str(again), "--baseline", "twin"])
    second = (again / "results.md").read_text(encoding="utf-8")
    assert not (again / "runs").exists()
    notes = [line for line in second.splitlines() if line.startswith("- read from ")]
    assert len(notes) == 1 and notes[0].startswith(f"- read from {from_runs / 'results.csv'} (43 rows)")
    assert same_report(first, second.replace(notes[0] + "\n", ""))


def same_report(first: str, second: str) -> bool:
    """The same text line by line, each number to the CSV's precision: it keeps losses to five
    decimals, so a loss shown to four may round the other way, and a bootstrap bound move a little."""
    lines, others = first.splitlines(), second.splitlines()
    if len(lines) != len(others):
        return False
    number = re.compile(r"(-?\d+\.\d+)")
    for line, other in zip(lines, others):
        parts, other_parts = number.split(line), number.split(other)
        if len(parts) != len(other_parts):
            return False
        for i, (a, b) in enumerate(zip(parts, other_parts)):
            same = abs(float(a) - float(b)) <= 1e-3 * max(1.0, abs(float(a))) if i % 2 else a == b
            if not same:
                return False
    return True


def test_only_some_arms_of_the_csv(tmp_path, monkeypatch):
    """--only picks arms of the file: the CSV's rows of the others are left out, not refused."""
    from minitx.ablation.report import designed_plots

    monkeypatch.setattr(designed_plots, "draw_all", lambda *args: None)
    text = rebuild(SHOWCASE_CSV, tmp_path / "two", "--only", "mha,qknorm")
    columns, rows = read_showcase()
    kept = sum(row["arm"] in ("mha", "qknorm") for row in rows)
    assert (
        f"({kept} rows; {len(rows) - kept} more of diff, gated, gqa, local, mla, mta, left out by --only)"
        in text
    )
    table, recorded = losses_table(text), losses_table((RECORDED / "results.md").read_text(encoding="utf-8"))
    assert {arm for _, arm in table} == {"mha", "qknorm"}
    # A point the whole sweep settled by a third seed (ᵐ) is judged on two arms' replicates here:
    # their noise, not the eight arms', decides whether its pair is far apart.
    assert all(same_cell(cell, recorded[key]) for key, cell in table.items() if "ᵐ" not in recorded[key])


def test_a_csv_a_spreadsheet_saved_is_read_the_same(tmp_path):
    """A byte-order mark, CRLF line ends and an error cell holding a line break (quoted)."""
    lines = SHOWCASE_CSV.read_text(encoding="utf-8").splitlines()
    lines[1] = lines[1].replace(",ok,,", ',failed,"out of memory\nat step 3",')
    path = tmp_path / "saved.csv"
    path.write_bytes(("\ufeff" + "\r\n".join(lines) + "\r\n").encode("utf-8"))
    rows, recorded = from_csv.read_rows(path), from_csv.read_rows(SHOWCASE_CSV)
    assert [r.name for r in rows] == [r.name for r in recorded]
    assert rows[0].status == "failed" and rows[0].error == "out of memory at step 3" and rows[0].loss is None
    assert [r.loss for r in rows[1:]] == [r.loss for r in recorded[1:]]


def test_from_csv_without_report_only_needs_a_held_out_rung_to_train(tmp_path, capsys):
    """Without --report-only, --from-csv trains the held-out rung a recorded sweep lacks; a config
    without ladder.holdout has nothing to train: refused in one line, nothing written."""
    config = tmp_path / "ladder.yaml"
    text = (ROOT / "configs" / "ablation_ladder.yaml").read_text(encoding="utf-8")
    text = "\n".join(line for line in text.splitlines() if not line.startswith("  holdout:"))
    config.write_text(
        text.replace("base: default.yaml", f"base: {ROOT / 'configs' / 'default.yaml'}"), encoding="utf-8"
    )
    argv = ["--config", str(config), "--output", str(tmp_path / "out"), "--from-csv", str(SHOWCASE_CSV)]
    assert ablate_main(argv) == 2
    err = capsys.readouterr().err
    assert "--from-csv without --report-only trains the held-out rung" in err and "add --report-only" in err
    assert not (tmp_path / "out").exists()
