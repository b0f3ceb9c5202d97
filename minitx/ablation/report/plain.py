"""The report of a sweep: results.csv (one row per run), results.md (mean ± spread per variant,
the differences from the reference variant with Welch's test, the diagnostics, and notes that say
how each column was measured) and the plots."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...evaluation.diagnostics import DIAGNOSTICS
from ...evaluation.missing import missing_diagnostic
from ...files.atomic import write_text_atomically
from ...flops import FLOP_CONVENTION
from ..analysis.equal_arms import equal_lines
from ..analysis.significance import CONFIDENCE, LEVEL, Difference, compare_all
from ..analysis.table import (
    DIAGNOSTIC_COLUMNS,
    TESTED_KEYS,
    aggregate,
    collect,
    columns_for,
    evaluated_lengths,
    length_key,
)
from ..analysis.verdicts import seeds_side
from ..analysis.wall_time import wall_time
from ..plan.sweep import Sweep
from ..runs.runner import Run
from .cells import row
from .written import WrittenReport

CSV_FIELDS = [
    "variant", "seed", "status", "error", "params", "params_non_embedding", "flops_per_token",
    "flop_convention", "mlp_hidden", "final_val_loss", "best_val_loss", "val_perplexity", "val_accuracy",
    "eval_loss", "eval_bits_per_char", "task_exact_match", "task_item_accuracy", "tokens_per_s",
    "peak_memory_mb", "memory_kind", "kv_bytes_per_token", "wall_time_s", "process_seconds", "finished_at",
    "tokens_seen", "steps", "device", "parallel", "budget_changes", "resized", "eval_note", "run_dir",
]  # fmt: skip
BASE_PLOTS = ("loss_curves.png", "cost_quality.png", "loss_vs_context.png")
DIAGNOSTIC_PLOTS = tuple(f"diag_{key}.png" for key in DIAGNOSTICS)
PLOTS = (*BASE_PLOTS, *DIAGNOSTIC_PLOTS)  # the diagnostic ones only where the sweep evaluates (plot_names)
MATCHED = {
    "params": "non-embedding parameters",
    "flops": "training FLOPs per token (without the output layer's)",
}


def csv_text(rows: list[dict]) -> str:
    at = CSV_FIELDS.index("eval_bits_per_char") + 1
    fields = [*CSV_FIELDS[:at], *(length_key(n) for n in evaluated_lengths(rows)), *CSV_FIELDS[at:]]
    if any(key in row for row in rows for key in DIAGNOSTICS):  # a sweep with `eval: false` has none
        at = fields.index("task_item_accuracy") + 1
        fields[at:at] = [*DIAGNOSTICS, "diagnostics_note"]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: ("" if r.get(k) is None else r[k]) for k in fields})
    return out.getvalue()


def write_csv(rows: list[dict], path: Path) -> None:
    write_text_atomically(path, csv_text(rows))


def format_cell(mean: float | None, std: float | None, fmt: str) -> str:
    if mean is None:
        return "–"
    text = fmt.format(mean)
    return text if std is None else f"{text} ± {fmt.format(std)}"


def _row(entry: dict, columns: list[tuple]) -> str:
    marks = (" †" if entry["budget_changes"] else "") + (" ‡" if entry.get("resized") else "")
    cells = [format_cell(*entry[key], fmt) for key, _, fmt, _ in columns]
    status = entry["status"]
    if entry.get("eval_note", "").startswith("evaluation failed"):
        status += f" ({entry['eval_note']})"
    return row(entry["variant"] + marks, *cells, f"{entry['ok']}/{entry['runs']}", status.replace("|", "\\|"))


def _footnotes(table: list[dict]) -> list[str]:
    lines = [
        f"† {e['variant']} changes the shared budget/data: {e['budget_changes']}"
        for e in table
        if e["budget_changes"]
    ]
    lines += [f"‡ {e['variant']}: {e['resized']}" for e in table if e.get("resized")]
    skipped = [e for e in table if e.get("eval_note") and not e["eval_note"].startswith("evaluation failed")]
    lines += [f"{e['variant']}: {e['eval_note']} (blank above)" for e in skipped]
    return lines


def _difference_cells(test: Difference | None, seeds: int) -> list[str]:
    """The difference with its interval, Holm's p and the verdict in words (the designed sweep's
    seeds test says it the same way: verdicts.seeds_side)."""
    if test is None:
        return ["needs 2+ seeds" if seeds < 2 else "–", "", ""]
    if math.isnan(test.p_holm):  # no spread on either side: no test (significance.welch)
        return [f"{test.difference:+.4f} (no spread: no test)", "–", "–"]
    cells = [f"{test.difference:+.4f} [{test.low:+.4f}, {test.high:+.4f}]", f"{test.p_holm:.2g}"]
    cells = [f"**{cell}**" for cell in cells] if test.significant else cells
    return [*cells, seeds_side(test)]


def differences_section(table: list[dict], reference: dict | None) -> list[str]:
    """The "Differences from <reference>" table: per tested loss, mean(variant) − mean(reference)
    with its Welch interval and Holm-adjusted p (Holm across the variants of that loss); empty
    when no variant can be tested."""
    if reference is None:
        return []
    name = reference["variant"]
    tests = {}
    for key in TESTED_KEYS:
        samples = {e["variant"]: e.get("samples", {}).get(key, []) for e in table}
        if found := compare_all(samples, name):
            tests[key] = found
    if not tests:
        return []
    headings = {key: heading for key, heading, *_ in columns_for([])}
    header = ["variant", "seeds"]
    for key in tests:
        header += [f"{headings[key]}: difference [{CONFIDENCE:.0%} CI]", "p (Holm)", "verdict"]
    lines = [
        f"## Differences from {name}",
        "",
        f"Welch's t-test of each variant's seeds against {name}'s, p Holm-corrected across the variants of each "
        f"column; **bold**: significant at p < {LEVEL:g}. The verdict: better or worse (a lower loss is better) "
        f"where it is significant, else no difference found, which rules out only differences beyond its interval: "
        "a wide one means too few seeds to say, not equal.",
        "",
        row(*header),
        "|---|---:|" + "---|---:|---|" * len(tests),
    ]
    for entry in table:
        if entry is reference:
            continue
        cells = [entry["variant"], str(entry["ok"])]
        for key, found in tests.items():
            cells += _difference_cells(found.get(entry["variant"]), len(entry["samples"][key]))
        lines.append(row(*cells))
    return [*lines, ""]


def diagnostics_section(table: list[dict]) -> list[str]:
    """The "Diagnostics" table: per variant the mean ± std over seeds of each run's diagnostics;
    – where no run of the variant has one, each with its reason below the table."""
    if not any("diagnostics" in e for e in table):
        return []
    lines = [
        "## Diagnostics",
        "",
        row("variant", *(heading for _, heading, _ in DIAGNOSTIC_COLUMNS), "seeds"),
        "|---|" + "---|" * len(DIAGNOSTIC_COLUMNS) + "---:|",
    ]
    for entry in table:
        found = entry.get("diagnostics") or {}
        cells = [format_cell(*found.get(key, (None, None)), fmt) for key, _, fmt in DIAGNOSTIC_COLUMNS]
        lines.append(row(entry["variant"], *cells, f"{entry['ok']}/{entry['runs']}"))
    notes = []
    for entry in table:
        reasons: dict[str, list[str]] = {}  # reason -> the headings it leaves blank
        for key, heading, _ in DIAGNOSTIC_COLUMNS:
            if reason := missing_diagnostic(entry, key):
                reasons.setdefault(reason, []).append(heading)
        for reason, headings in reasons.items():
            which = "" if len(headings) == len(DIAGNOSTIC_COLUMNS) else ", " + ", ".join(headings)
            notes.append(f"– {entry['variant']}{which}: {reason}")
    return [*lines, "", *notes, *([""] if notes else [])]


def markdown_table(
    table: list[dict],
    title: str = "",
    notes: Sequence[str] = (),
    reference: str | None = None,
    rows: Sequence[dict] = (),
) -> str:
    """The per-variant table, the differences from the reference and the diagnostics; `reference`:
    the variant the differences are measured against (default the first row); `rows`: the runs,
    for the variants that ended equal to 4 decimals (analysis/equal_arms.py)."""
    every = columns_for(evaluated_lengths(table))
    columns = [c for c in every if any(entry.get(c[0], (None, None))[0] is not None for entry in table)]
    first = table[0] if table and reference is None else None
    header = ["variant", *(heading for _, heading, _, _ in columns), "seeds", "status"]
    lines = [f"# {title}", ""] if title else []
    lines += [row(*header), "|" + "|".join("---" for _ in header) + "|"]
    lines += [_row(entry, columns) for entry in table]
    footnotes = _footnotes(table)
    lines += ["", *footnotes, ""] if footnotes else [""]
    lines += [f"**Note:** {line}." for line in equal_lines(_losses_by_seed(rows))]
    lines += [""] if lines[-1] else []
    lines += differences_section(table, next((e for e in table if e["variant"] == reference), first))
    lines += diagnostics_section(table)
    lines += [f"- {note}" for note in notes]
    return "\n".join(lines).rstrip() + "\n"


def _losses_by_seed(rows: Sequence[dict]) -> dict[str, dict[int, float]]:
    found: dict[str, dict[int, float]] = {}
    for r in rows:
        if r["status"] == "ok" and r.get("final_val_loss") is not None:
            found.setdefault(r["variant"], {})[r["seed"]] = r["final_val_loss"]
    return found


def standard_notes(rows: list[dict], table: list[dict], sweep: Sweep | None) -> list[str]:
    kinds = sorted({r["memory_kind"] for r in rows if r.get("memory_kind")})
    devices = sorted({r["device"] for r in rows if r.get("device")})
    notes = [
        "mean ± sample std over seeds; a value without ± comes from one seed",
        "params: all parameters; non-emb params: without the token and position tables and an untied output layer; "
        "train FLOPs/token: Transformer.flops_per_token at block_size, convention "
        f"{FLOP_CONVENTION} (6 per matmul weight plus each layer's attention work over the pairs its queries "
        "see: a window's pairs, diff's two maps, MTA's convolutions and head mixes; "
        "docs/attention.md#training-flops-per-token)",
        "tokens/s: the training command's own meter (the one behind its logged tokens_per_sec) over the whole run: "
        "training steps from the end of the first, validation left out",
        f"peak memory: {', '.join(kinds) or 'n/a'} (CPU peak RSS is the whole process: Python, torch, data)",
        "KV cache B/token: minitx.kv_cache_bytes(config, block_size) / block_size, float32, batch 1",
        "wall time (s): the training loop (fit) of one run, validation included",
        f"device: {', '.join(devices) or 'n/a'}",
    ]
    if sweep is not None and sweep.evaluation.enabled:
        most = sweep.evaluation.max_tokens
        notes += [
            f"held-out loss, bits/char, loss @ L: minitx.evaluation on each run's best checkpoint, the run's "
            f"validation text ({f'its first {most:,} tokens' if most else 'all of it'}) scored in non-overlapping "
            "windows of L tokens (block_size for the held-out loss); task exact match and item accuracy: a fresh, "
            "seeded test set of the run's synthetic task",
            "diagnostics: eval_runs.diagnose_run on each run's last checkpoint, 100 sequences of min(64, block_size) "
            "tokens of its validation text through each kind's materialised attention: first-token share (attention "
            "on position 0, mean over heads, then layers), sink rate (share of layer-heads whose mean attention on "
            "key 0 exceeds 0.3), massive activations (the largest per-layer max/median |h| of the residual stream), "
            "attention entropy (per query, over the log of the keys it sees); each – is explained below the "
            "Diagnostics table",
        ]
    if sweep is not None and sweep.match:
        notes.append(
            f"match: {sweep.match}: each variant's MLP width was set so that its {MATCHED[sweep.match]} are within 2% "
            f"of {sweep.reference.name}'s (‡ where a width changed)"
        )
    older = sorted({r.get("flop_convention") for r in rows} - {None, FLOP_CONVENTION})
    if older:
        variants = sorted({r["variant"] for r in rows if r.get("flop_convention") in older})
        notes.append(
            f"train FLOPs/token of {', '.join(variants)}: recorded under the older count {', '.join(older)} "
            f"(summary.json without flop_convention: each kind's code as it ran on its device), not {FLOP_CONVENTION}"
        )
    if spent := wall_time((r.get("finished_at"), r.get("process_seconds")) for r in rows):
        notes.append(spent)
    parallel = max((r["parallel"] or 1 for r in rows if r["status"] == "ok"), default=1)
    if parallel > 1:
        notes.insert(
            0,
            f"runs went up to {parallel} at a time, sharing the machine: tokens/s and wall times are lower than alone",
        )
    budgets = {e["variant"]: e["tokens_seen"][0] for e in table if e["tokens_seen"][0] is not None}
    if len(set(budgets.values())) > 1:  # a budget change slipped through (or was allowed): say so
        notes.insert(0, f"the variants did not all see the same number of tokens: {budgets}")
    return notes


@dataclass(frozen=True)
class PlainReport(WrittenReport):
    table: list[dict]  # mean and spread per variant (analysis/table.aggregate)


def write_results(runs: list[Run], output: Path, sweep: Sweep | None = None, **options) -> PlainReport:
    """The report of finished runs (collect reads them); `options`: write_report's."""
    rows = collect(runs, None if sweep is None else sweep.evaluation)
    return write_report(rows, output, sweep=sweep, **options)


def write_report(
    rows: list[dict],
    output: Path,
    notes: Sequence[str] = (),
    title: str = "Ablation",
    sweep: Sweep | None = None,
    reference: str | None = None,
    curves: bool = True,
) -> PlainReport:
    """results.csv, results.md and the plots of a sweep's rows (one per run, as collect makes them,
    or as a results.csv recorded them: runs/plain_csv.py, whose rows hold no validation curve:
    `curves` False, no loss_curves.png); `reference`: the variant the others are compared with
    (default the sweep's reference: --baseline)."""
    table = aggregate(rows)
    write_csv(rows, output / "results.csv")
    if reference is None and sweep is not None and sweep.reference is not None:
        reference = sweep.reference.name
    text = markdown_table(table, title, [*standard_notes(rows, table, sweep), *notes], reference, rows)
    write_text_atomically(output / "results.md", text)
    from . import plain_plots as plots

    if curves:
        plots.loss_curves(table, output / PLOTS[0])
    plots.cost_quality(table, output / PLOTS[1])
    plots.loss_vs_context(table, evaluated_lengths(rows), output / PLOTS[2])
    if any("diagnostics" in entry for entry in table):
        for key, heading, _ in DIAGNOSTIC_COLUMNS:
            plots.diagnostic_bars(table, key, heading, output / f"diag_{key}.png")
    return PlainReport(output, text, plot_names(sweep, curves), table)


def plot_names(sweep: Sweep | None, curves: bool = True) -> tuple[str, ...]:
    """The plots write_report draws for this sweep: no diagnostics where it does not evaluate, no
    loss curves (the first) without curves (a report from a CSV)."""
    names = PLOTS if sweep is None or sweep.evaluation.enabled else BASE_PLOTS
    return names if curves else names[1:]
