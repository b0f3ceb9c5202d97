"""Evaluation after each run: the held-out figures of minitx.evaluation on every finished run's
best checkpoint, and the diagnostics of its last, each cached in the run's directory. The sweep
(plain_sweep.py, designed_sweep.py) starts them here; the tables only read the caches.

A rerun of a finished sweep reads the cache (evaluation.json) instead of evaluating again; the
cache is keyed by the evaluation settings and the checkpoint file, so a retrained run or new
settings are evaluated afresh. A failed evaluation is recorded as a note for the run's row, never
the end of the sweep, and is tried again on the next run of the sweep.

A sweep of a kind defined outside minitx names its modules in its own config
(attention.kind_modules): that is the user's consent to their code, for training and for the
evaluation of the sweep's runs alike, so a run's checkpoint may import those modules and no other
(`sweep_kind_modules`, passed on as load_checkpoint's trust_kind_modules).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...errors import one_line
from ...evaluation import evaluate_checkpoint
from ...files.atomic import read_json, write_json_atomically
from ...files.checkpoint import BEST, LAST
from ..plan.budget import model_section
from ..plan.commands import is_synthetic
from ..plan.sweep import EvalSettings, Sweep
from .runner import SUMMARY_FILE, Run, is_finished

EVAL_FILE = "evaluation.json"
CHECKPOINT_DIR = "checkpoints"  # inside a run's directory (minitx/files/checkpoint.py's layout)


def best_checkpoint(run: Run) -> Path | None:
    for name in (BEST, LAST):  # best.ckpt exists once a validation ran; last.ckpt always
        path = run.directory / CHECKPOINT_DIR / name
        if path.is_file():
            return path
    return None


def sweep_kind_modules(sweep: Sweep, extra: Sequence[str] = ()) -> list[str]:
    """The modules of kinds that the sweep's own configs name (attention.kind_modules of the base,
    the shared overrides, each variant's and `extra`, the training arguments given after --)."""
    modules: dict[str, None] = {}
    for variant in sweep.variants:
        named = (model_section(sweep, variant, extra).get("attention") or {}).get("kind_modules")
        if isinstance(named, (list, tuple)):
            modules.update(dict.fromkeys(name for name in named if isinstance(name, str)))
    return list(modules)


def cache_key(run: Run, settings: EvalSettings) -> dict | None:
    summary = read_json(run.directory / SUMMARY_FILE) or {}
    checkpoint = best_checkpoint(run)
    if checkpoint is None or not summary.get("block_size"):
        return None
    stat, block = checkpoint.stat(), summary["block_size"]
    return {
        "checkpoint": str(checkpoint.relative_to(run.directory)),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        # the contexts scored: the sweep file's, else the training length and 2x and 4x it
        "lengths": list(settings.lengths) if settings.lengths else [block, 2 * block, 4 * block],
        "max_tokens": settings.max_tokens,
    }


def cached_evaluation(run: Run, settings: EvalSettings) -> dict | None:
    """The run's cached {"key", "result"} or {"key", "error"} when it belongs to these settings and
    the run's present checkpoint; None when there is none (evaluation off, run unfinished, not yet
    evaluated). Reads only: what a table shows."""
    if not settings.enabled or not is_finished(run):
        return None
    key = cache_key(run, settings)
    cached = read_json(run.directory / EVAL_FILE) if key is not None else None
    return cached if cached is not None and cached.get("key") == key else None


def evaluate_run(
    run: Run, settings: EvalSettings, log: Any = print, trust_kind_modules: Sequence[str] = ()
) -> dict | None:
    """{"key", "result"} or {"key", "error"} for a finished run, from the cache when it holds a
    result (a failure is tried again); None when there is nothing to evaluate (evaluation off, run
    unfinished). Its checkpoint may import `trust_kind_modules`, the sweep's own (sweep_kind_modules)."""
    cached = cached_evaluation(run, settings)
    if cached is not None and "result" in cached:
        return cached
    if not settings.enabled or not is_finished(run):
        return None
    key = cache_key(run, settings)
    if key is None:
        return {"key": None, "error": f"no checkpoint in {run.directory / CHECKPOINT_DIR} to evaluate"}
    log(f"ablate: eval   {run.label}")
    checkpoint, trusted = str(run.directory / key["checkpoint"]), list(trust_kind_modules)
    try:
        result = evaluate_checkpoint(
            checkpoint, key["lengths"], key["max_tokens"], trust_kind_modules=trusted
        )
        record = {"key": key, "result": result}
    except Exception as error:  # noqa: BLE001 - any failure of one evaluation is that row's note
        record = {"key": key, "error": f"evaluation failed: {one_line(error, 300)}"}
        log(f"ablate: eval   {run.label} failed: {record['error']}")
    write_json_atomically(run.directory / EVAL_FILE, record)
    return record


def evaluate_runs(
    runs: list[Run], settings: EvalSettings, log: Any = print, trust_kind_modules: Sequence[str] = ()
) -> None:
    for run in runs:
        evaluate_run(run, settings, log, trust_kind_modules)


# -- diagnostics of every run ------------------------------------------------------------------
DIAGNOSTICS_FILE = "diagnostics.json"


def diagnose(checkpoint: Path, trust_kind_modules: Sequence[str] = ()) -> dict:
    """minitx.evaluation.diagnostics on the run's own held-out text (its validation split):
    100 sequences of min(64, block_size) tokens, through each kind's materialised attention."""
    from ...evaluation.diagnostics import run_diagnostics, validation_sequences
    from ...evaluation.evaluate import DIAGNOSTIC_LENGTH, DIAGNOSTIC_SEQUENCES, load_checkpoint

    model, tokenizer, raw = load_checkpoint(
        str(checkpoint), label="diagnostics", trust_kind_modules=list(trust_kind_modules)
    )
    length = min(DIAGNOSTIC_LENGTH, model.config.block_size)
    train_config = raw["minitx"].get("train_config") or {}
    return run_diagnostics(model, validation_sequences(train_config, tokenizer, DIAGNOSTIC_SEQUENCES, length))


def read_diagnostics(run: Run) -> dict | None:
    """The run's cached diagnostics, if they belong to its present last checkpoint."""
    cached = read_json(run.directory / DIAGNOSTICS_FILE)
    if cached is None or "result" not in cached or cached.get("key") != _diagnostics_key(run):
        return None
    return cached["result"]


def _diagnostics_key(run: Run) -> dict | None:
    path = run.directory / CHECKPOINT_DIR / LAST  # the model as training left it, decay included
    if not path.is_file():
        return None
    stat = path.stat()
    return {"checkpoint": LAST, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def diagnose_run(run: Run, trust_kind_modules: Sequence[str] = (), log: Any = print) -> dict | None:
    """Diagnostics of a finished run, computed once per checkpoint (diagnostics.json); a failure
    is logged and recorded, never the end of the sweep."""
    key = _diagnostics_key(run)
    if not is_finished(run) or key is None:
        return None
    found = read_diagnostics(run)
    if found is not None:
        return found
    try:
        record = {"key": key, "result": diagnose(run.directory / CHECKPOINT_DIR / LAST, trust_kind_modules)}
    except Exception as error:  # noqa: BLE001 - one run's failure is that run's note
        record = {"key": key, "error": f"diagnostics failed: {one_line(error, 300)}"}
        log(f"ablate: diagnostics of {run.label} failed: {record['error']}")
    write_json_atomically(run.directory / DIAGNOSTICS_FILE, record)
    return record.get("result")


def diagnose_runs(
    runs: Sequence[Run],
    sweep: Sweep,
    extra: Sequence[str] = (),
    trust_kind_modules: Sequence[str] = (),
    log: Any = print,
) -> None:
    """Diagnostics of every finished run of a plain sweep (cached per run, diagnostics.json),
    beside its evaluation: none where the sweep does not evaluate (`eval: false` keeps its old,
    cheaper report), nor for a synthetic task, which has no held-out text to read."""
    if not sweep.evaluation.enabled:
        return
    for run in runs:
        if not is_synthetic(sweep, run.variant, extra):
            diagnose_run(run, trust_kind_modules, log)
