"""The numbers of a sweep: one row per run (collect), then mean and spread per variant (aggregate),
with each variant's seed values of the tested losses kept for the significance tests (report/).
It reads what the runs left (summary.json, run.json, the cached evaluation and diagnostics) and
computes nothing of a run: evaluating the runs is the runs stage's (runs/eval_runs.py)."""

from __future__ import annotations

import json
import math
from typing import Any

from ...evaluation.diagnostics import DIAGNOSTICS
from ...files.atomic import read_json
from ...flops import OLDER_CONVENTION
from ..plan.sweep import EvalSettings
from ..runs.eval_runs import DIAGNOSTICS_FILE, cached_evaluation, read_diagnostics
from ..runs.runner import RUN_FILE, SUMMARY_FILE, Run

# (column in results.csv, heading in results.md, format, higher is better? None: not a quality)
COLUMNS = [
    ("params", "params", "{:,.0f}", None),
    ("params_non_embedding", "non-emb params", "{:,.0f}", None),
    ("flops_per_token", "train FLOPs/token", "{:,.0f}", None),
    ("final_val_loss", "final val loss", "{:.4f}", False),
    ("best_val_loss", "best val loss", "{:.4f}", False),
    ("val_perplexity", "val ppl (final)", "{:.3f}", False),
    ("val_accuracy", "exact match (final)", "{:.3f}", True),
    ("tokens_per_s", "tokens/s", "{:,.0f}", True),
    ("peak_memory_mb", "peak memory (MB)", "{:,.0f}", False),
    ("kv_bytes_per_token", "KV cache B/token", "{:,.0f}", False),
    ("wall_time_s", "wall time (s)", "{:.0f}", False),
    ("tokens_seen", "tokens seen", "{:,.0f}", None),
]
# Figures of the evaluation after each run (eval_runs.py); loss @ L columns follow the first two.
EVAL_COLUMNS = [
    ("eval_loss", "held-out loss", "{:.4f}", False),
    ("eval_bits_per_char", "bits/char", "{:.4f}", False),
    ("task_exact_match", "task exact match", "{:.3f}", True),
    ("task_item_accuracy", "task item accuracy", "{:.3f}", True),
]


# The losses each variant is tested on against the reference (Welch over seeds, report/plain.py).
TESTED_KEYS = ("final_val_loss", "eval_loss")
# Diagnostics of each run (eval_runs.diagnose_run), means over seeds: the designed sweep's own
# list and names, so that both reports say the same thing.
DIAGNOSTIC_COLUMNS = [
    (key, DIAGNOSTICS[key], "{:,.1f}" if key == "massive_ratio" else "{:.3f}") for key in DIAGNOSTICS
]


def length_key(length: int) -> str:
    return f"loss_at_{length}"


def columns_for(lengths: list[int]) -> list[tuple]:
    """Every column of a table whose evaluations scored these context lengths."""
    at_length = [(length_key(n), f"loss @ {n}", "{:.4f}", False) for n in lengths]
    quality_end = [key for key, *_ in COLUMNS].index("val_accuracy") + 1
    return [*COLUMNS[:quality_end], *EVAL_COLUMNS[:2], *at_length, *EVAL_COLUMNS[2:], *COLUMNS[quality_end:]]


def eval_fields(record: dict | None) -> dict[str, Any]:
    """A run's evaluation figures as row fields; a skipped length is None with its reason in eval_note."""
    if record is None:
        return {"eval_note": ""}
    if "error" in record:
        return {"eval_note": record["error"]}
    result = record["result"]
    task = result.get("task") or {}
    fields = {
        "eval_loss": result.get("loss"),
        "eval_bits_per_char": result.get("bits_per_char"),
        "task_exact_match": task.get("exact_match"),
        "task_item_accuracy": task.get("item_accuracy"),
    }
    notes = []
    for length, figures in sorted((result.get("by_length") or {}).items(), key=lambda item: int(item[0])):
        fields[length_key(int(length))] = figures.get("loss")
        if figures.get("loss") is None:
            notes.append(f"loss @ {length}: {figures.get('skipped', 'not measured')}")
    fields["eval_note"] = "; ".join(notes)
    return fields


def diagnostic_fields(run: Run, evaluation: EvalSettings) -> dict[str, Any]:
    """A run's cached diagnostics as row fields (None where it has none); nothing when the sweep
    does not evaluate, so such a sweep's table and csv stay as they were."""
    if not evaluation.enabled:
        return {}
    found = read_diagnostics(run) or {}
    fields: dict[str, Any] = {key: found.get(key) for key in DIAGNOSTICS}
    cached = read_json(run.directory / DIAGNOSTICS_FILE) or {}
    fields["diagnostics_note"] = "" if found else cached.get("error", "")
    return fields


def device_label(device: str | None, gpus: list[str] | None) -> str | None:
    """The device a run trained on, and which of the machine's GPUs it was given, where it was
    given some (launch.py): every such run sees its own as cuda:0."""
    if device is None or not gpus:
        return device
    return f"{device} (GPU {','.join(gpus)})"


def run_status(finished: bool, record: dict) -> tuple[str, str]:
    """A run's status and error, from whether it finished and its run.json (plain and designed)."""
    if finished:
        return "ok", ""
    if record.get("status") in ("failed", "cancelled"):  # cancelled: its SLURM job (runs/slurm.py)
        return record["status"], record.get("error", "")
    return "not run", ""


def collect(runs: list[Run], evaluation: EvalSettings | None = None) -> list[dict]:
    """One row per run: its status and numbers (None where a run has none)."""
    evaluation = evaluation or EvalSettings()
    rows = []
    for run in runs:
        record = read_json(run.directory / RUN_FILE) or {}
        summary = read_json(run.directory / SUMMARY_FILE)
        status, error = run_status(summary is not None, record)
        summary = summary or {}
        final = summary.get("final_val_loss")
        changes = run.variant.budget_changes()
        row: dict[str, Any] = {key: summary.get(key) for key, *_ in COLUMNS}
        row.update(
            variant=run.variant.name,
            seed=run.seed,
            status=status,
            error=error,
            val_perplexity=math.exp(final) if final is not None and final < 50 else None,
            val_accuracy=summary.get("final_val_accuracy"),
            peak_memory_mb=summary["peak_memory_bytes"] / 2**20 if summary.get("peak_memory_bytes") else None,
            memory_kind=summary.get("memory_kind"),
            wall_time_s=summary.get("train_seconds"),
            process_seconds=record.get("process_seconds"),
            finished_at=record.get("finished_at"),
            parallel=record.get("parallel", 1),
            steps=summary.get("steps"),
            device=device_label(summary.get("device"), record.get("gpus")),
            mlp_hidden=summary.get("mlp_hidden"),
            # the count a run recorded is its minitx's: an older one's says so (minitx/flops.py)
            flop_convention=summary.get("flop_convention", OLDER_CONVENTION)
            if summary.get("flops_per_token")
            else None,
            budget_changes=json.dumps(changes) if changes else "",
            resized=run.variant.resized,
            run_dir=str(run.directory),
            curve=summary.get("curve", []),
        )
        row.update(eval_fields(cached_evaluation(run, evaluation)))
        row.update(diagnostic_fields(run, evaluation))
        rows.append(row)
    return rows


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (None for one value: no spread to report)."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def mean_curve(curves: list[list[dict]]) -> list[tuple[float, float, float]]:
    """(tokens, mean val loss, std) at the validation points all seeds share."""
    curves = [c for c in curves if c]
    if not curves:
        return []
    common = set.intersection(*({p["tokens"] for p in c} for c in curves))
    points = []
    for tokens in sorted(common):
        losses = [next(p["val_loss"] for p in c if p["tokens"] == tokens) for c in curves]
        mean, std = mean_std(losses)
        points.append((tokens, mean, std or 0.0))
    return points


def evaluated_lengths(rows: list[dict]) -> list[int]:
    prefix = length_key(0)[:-1]
    return sorted({int(key[len(prefix) :]) for row in rows for key in row if key.startswith(prefix)})


def _variant_status(runs: list[dict], ok: list[dict]) -> str:
    for word in ("failed", "cancelled"):
        hit = [r for r in runs if r["status"] == word]
        if hit:
            return f"{len(hit)}/{len(runs)} {word}: {hit[0]['error']}"
    if len(ok) < len(runs):
        return f"{len(runs) - len(ok)}/{len(runs)} not run"
    return "ok"


def aggregate(rows: list[dict]) -> list[dict]:
    """Per variant, in sweep order: mean and std of every column over its finished seeds."""
    by_variant: dict[str, list[dict]] = {}
    for row in rows:
        by_variant.setdefault(row["variant"], []).append(row)
    keys = [key for key, *_ in columns_for(evaluated_lengths(rows))]
    table = []
    for name, runs in by_variant.items():
        ok = [r for r in runs if r["status"] == "ok"]
        entry: dict[str, Any] = {
            "variant": name,
            "runs": len(runs),
            "ok": len(ok),
            "budget_changes": runs[0]["budget_changes"],
            "resized": runs[0].get("resized", ""),
            "status": _variant_status(runs, ok),
        }
        for key in keys:
            entry[key] = mean_std([r.get(key) for r in ok])
        # The seed values themselves: a test needs more than a mean and a spread.
        entry["samples"] = {key: [r[key] for r in ok if r.get(key) is not None] for key in TESTED_KEYS}
        if any(key in r for r in runs for key in DIAGNOSTICS):
            entry["diagnostics"] = {key: mean_std([r.get(key) for r in ok]) for key in DIAGNOSTICS}
            entry["diagnostics_note"] = "; ".join(
                dict.fromkeys(r["diagnostics_note"] for r in ok if r.get("diagnostics_note"))
            )
        entry["curve"] = mean_curve([r["curve"] for r in ok])
        entry["memory_kind"] = ", ".join(sorted({r["memory_kind"] for r in ok if r["memory_kind"]}))
        entry["eval_note"] = "; ".join(dict.fromkeys(r["eval_note"] for r in ok if r.get("eval_note")))
        table.append(entry)
    return table
