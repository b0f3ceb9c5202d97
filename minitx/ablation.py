"""Ablation sweeps: which attention, at what cost?

    python ablate.py --config configs/ablation.yaml --output runs/ablation [--seeds 3] [--parallel 2]

A sweep is one training config (the base) plus named variants, each a few dotted overrides of
it. Every (variant, seed) pair is one run of the ordinary training command, in a subprocess with
its own directory, so a crash stays in its run, runs can go in parallel, and the only thing this
file relies on is the training command line. The runs share data, tokenizer, seeds and token
budget: a variant may not override those unless it says `allow_budget_change: true`, and the
table then says what it changed. Before any run starts, every variant's config is parsed and
checked as the training command will (`check_variants`): a mistake in a config stops the sweep with
one line, while a failure during training stays a row in the table.

Each run's numbers come from `RunSummary`, a Lightning callback this file adds to the training
command; it writes `summary.json` when training ends. A run counts as finished when that file
exists, so rerunning the sweep skips finished runs and retries the rest.

The sweep file (YAML):

    base: default.yaml                  # training config: a path (relative to this file) or a mapping
    overrides: {trainer.max_steps: 300} # applied to every run: the shared budget
    seed: 1337                          # first seed; --seeds N runs seed, seed+1, ..., seed+N-1
    seeds: 1
    variants:
      - name: mha
        overrides: {model.attention.kind: mha}
      - name: gqa
        overrides: {model.attention.kind: gqa, model.attention.n_kv_head: 2}

Output: runs/<variant>-seed<k>/ (the run's own logs and checkpoints, run.json, summary.json,
train.log), results.csv (one row per run), results.md (mean +- std over seeds per variant),
loss_curves.png and cost_quality.png.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml

from .arguments import ArgumentParser
from .errors import UserError

# Keys a variant may not change on its own: they decide the data, the seed or the token budget,
# and a comparison is only fair when all variants share them.
BUDGET_KEYS = (
    "trainer.max_steps",
    "trainer.max_epochs",
    "trainer.max_time",
    "trainer.limit_train_batches",
    "trainer.accumulate_grad_batches",
    "trainer.devices",
    "trainer.num_nodes",
    "model.block_size",
    "seed_everything",
)
BUDGET_PREFIXES = ("data.",)  # every data setting: source, tokenizer, batch, block, seed, ...

# Keys the sweep itself sets for every run: where it writes, what it resumes from.
RESERVED_KEYS = ("run.root", "run.name", "ckpt_path", "config")

# How a run is launched: the training command's contract (minitx/training.py).
TRAIN_COMMAND = [sys.executable, "-c", "import sys; from minitx.cli import train_main; sys.exit(train_main())"]
SEED_KEYS = ("seed_everything", "data.seed")  # weights and dropout; the order of training batches
SUMMARY_CALLBACK = "minitx.ablation.RunSummary"
# Quiet, quick defaults for runs nobody watches; the sweep file's overrides come after and win.
RUN_DEFAULTS = {"trainer.enable_progress_bar": False, "run.sample_tokens": 0}

# Every run reads this copy of the base config, written once per sweep: an edit of the original
# file while the sweep runs cannot give later runs a different base.
BASE_SNAPSHOT = "base_config.yaml"
SUMMARY_FILE = "summary.json"
RUN_FILE = "run.json"
LOG_FILE = "train.log"


# ------------------------------------------------------------------------------ the sweep file


@dataclass
class Variant:
    name: str
    overrides: dict[str, Any]
    allow_budget_change: bool = False

    def budget_changes(self) -> dict[str, Any]:
        return {key: value for key, value in self.overrides.items() if is_budget_key(key)}


@dataclass
class Sweep:
    base_text: str  # the training config every run starts from (YAML text)
    overrides: dict[str, Any]
    variants: list[Variant]
    seed: int = 1337
    seeds: int = 1


def is_budget_key(key: str) -> bool:
    return key in BUDGET_KEYS or key.startswith(BUDGET_PREFIXES)


def _flatten(mapping: Any, where: str) -> dict[str, Any]:
    """{'model.attention': {'kind': 'gqa'}} and {'model.attention.kind': 'gqa'} both -> dotted keys."""
    if mapping is None:
        return {}
    if not isinstance(mapping, dict):
        raise UserError(f"{where}: expected a mapping of dotted keys to values, got {type(mapping).__name__}")
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        if not isinstance(key, str) or not key:
            raise UserError(f"{where}: keys must be non-empty strings like model.attention.kind, got {key!r}")
        if isinstance(value, dict) and value:
            for inner, inner_value in _flatten(value, f"{where}.{key}").items():
                flat[f"{key}.{inner}"] = inner_value
        else:
            flat[key] = value
    for key in flat:
        if key in RESERVED_KEYS:
            raise UserError(f"{where}: {key} is set by the sweep for each run (see --output); remove it")
    return flat


def _read_yaml(path: Path, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except FileNotFoundError:
        raise UserError(f"{what}: file {path} not found; check the path") from None
    except yaml.YAMLError as error:
        first = str(error).strip().splitlines()[0]
        raise UserError(f"{what}: {path} is not valid YAML ({first}); fix the file") from None


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file."""
    path = Path(path)
    data = _read_yaml(path, "--config")
    if not isinstance(data, dict):
        raise UserError(f"--config: {path} must hold a mapping with 'base' and 'variants'; see minitx/ablation.py")
    known = {"base", "overrides", "variants", "seed", "seeds"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise UserError(f"{path}: unknown key(s) {', '.join(unknown)}; use {', '.join(sorted(known))}")

    base = data.get("base")
    if isinstance(base, str):
        candidates = [path.parent / base, Path(base)]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            raise UserError(f"{path}: base config {base!r} not found next to the sweep file or in the current directory")
        base_text = found.read_text(encoding="utf-8")
    elif isinstance(base, dict):
        base_text = yaml.safe_dump(base, sort_keys=False)
    else:
        raise UserError(f"{path}: 'base' must be a training config path or an inline mapping")

    raw_variants = data.get("variants")
    if not isinstance(raw_variants, list) or not raw_variants:
        raise UserError(f"{path}: 'variants' must be a non-empty list of {{name, overrides}}")
    variants: list[Variant] = []
    for i, raw in enumerate(raw_variants):
        where = f"{path}: variants[{i}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"].strip():
            raise UserError(f"{where}: needs a 'name' (text) and 'overrides' (a mapping)")
        bad = sorted(set(raw) - {"name", "overrides", "allow_budget_change"})
        if bad:
            raise UserError(f"{where}: unknown key(s) {', '.join(bad)}; use name, overrides, allow_budget_change")
        name = raw["name"].strip()
        if not all(ch.isalnum() or ch in "+-_." for ch in name):
            raise UserError(f"{where}: name {name!r} may hold only letters, digits and + - _ . (it names a folder)")
        if name in {v.name for v in variants}:
            raise UserError(f"{where}: duplicate variant name {name!r}; give each variant its own name")
        variant = Variant(name, _flatten(raw.get("overrides"), f"{where}.overrides"), bool(raw.get("allow_budget_change", False)))
        changes = variant.budget_changes()
        if changes and not variant.allow_budget_change:
            keys = ", ".join(sorted(changes))
            raise UserError(
                f"{where} ({name}): overrides {keys}, which changes the data, seed or token budget of this "
                "variant alone; move it to the shared 'overrides' or set allow_budget_change: true"
            )
        variants.append(variant)

    seed, seeds = data.get("seed", 1337), data.get("seeds", 1)
    for key, value, low in (("seed", seed, 0), ("seeds", seeds, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise UserError(f"{path}: '{key}' must be a whole number >= {low}, got {value!r}")
    return Sweep(base_text, _flatten(data.get("overrides"), f"{path}: overrides"), variants, seed, seeds)


# ------------------------------------------------------------------------------ running


def format_value(value: Any) -> str:
    """A command-line value the training CLI parses back to the same thing (JSON is YAML)."""
    return value if isinstance(value, str) else json.dumps(value)


@dataclass
class Run:
    variant: Variant
    seed: int
    directory: Path  # the training run's own directory: <output>/runs/<variant>-seed<seed>
    command: list[str]
    fingerprint: str  # base config + overrides + seed: detects a changed sweep in an old output dir

    @property
    def label(self) -> str:
        return f"{self.variant.name} seed {self.seed}"


def plan_runs(sweep: Sweep, output: Path, seeds: int, extra: Sequence[str] = (), logging: Sequence[str] = ()) -> list[Run]:
    """One run per (variant, seed). `extra`: training arguments for every run (part of the
    settings a finished run is checked against); `logging`: arguments that change where runs
    report (W&B), not what they compute."""
    runs = []
    for variant in sweep.variants:
        for seed in range(sweep.seed, sweep.seed + seeds):
            root, name = output / "runs", f"{variant.name}-seed{seed}"
            overrides = run_overrides(sweep, variant.overrides, seed)
            command = [*TRAIN_COMMAND, *train_arguments(output / BASE_SNAPSHOT, root, name, overrides, [*extra, *logging])]
            settings = json.dumps([sweep.base_text, sorted((k, format_value(v)) for k, v in overrides.items()), list(extra)])
            runs.append(Run(variant, seed, root / name, command, hashlib.sha256(settings.encode()).hexdigest()[:16]))
    return runs


def run_overrides(sweep: Sweep, variant_overrides: dict[str, Any], seed: int) -> dict[str, Any]:
    """The dotted overrides of one run: quiet defaults, the shared ones, the variant's, the seed."""
    return {**RUN_DEFAULTS, **sweep.overrides, **variant_overrides, **{key: seed for key in SEED_KEYS}}


def train_arguments(base_config: Path, root: Path, name: str, overrides: dict[str, Any], extra: Sequence[str]) -> list[str]:
    """The training command's arguments for one run (everything after TRAIN_COMMAND)."""
    arguments = ["--config", str(base_config), "--run.root", str(root), "--run.name", name]
    for key, value in overrides.items():
        arguments += [f"--{key}", format_value(value)]
    return [*arguments, "--trainer.callbacks+=" + SUMMARY_CALLBACK, *extra]


def check_variants(sweep: Sweep, sweep_path: Path, extra: Sequence[str] = ()) -> None:
    """Parse every variant's training config as the train command will, before any run starts.

    A mistake in the config (unknown key, wrong type, a model that cannot be built) then stops
    the sweep at once with one line naming the variant and the key, instead of failing the same
    way in every run after the others have trained for an hour. What only training can find (a
    missing data file, a loss gone NaN) still fails just its run, a row in the table.
    """
    from .training import check_train_args

    with tempfile.TemporaryDirectory(prefix="minitx-ablate-") as scratch:
        base = Path(scratch) / BASE_SNAPSHOT
        base.write_text(sweep.base_text, encoding="utf-8")
        root = Path(scratch) / "runs"  # never written: checking builds nothing

        def check(variant_overrides: dict[str, Any], name: str) -> Optional[str]:
            arguments = train_arguments(base, root, name, run_overrides(sweep, variant_overrides, sweep.seed), extra)
            try:
                check_train_args(arguments)
            except UserError as error:
                return str(error)
            return None

        for variant in sweep.variants:
            problem = check(variant.overrides, variant.name)
            if problem is None:
                continue
            # The same mistake without the variant's overrides is the base's (or the shared overrides').
            if not variant.overrides or check({}, "base") == problem:
                raise UserError(f"{sweep_path}: base config or shared overrides: {problem}")
            raise UserError(f"{sweep_path}: variant {variant.name!r}: {problem}")


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def is_finished(run: Run) -> bool:
    return (run.directory / SUMMARY_FILE).is_file()


def check_same_settings(run: Run) -> None:
    """Refuse to mix a finished run made with other settings into this sweep's table."""
    record = _read_json(run.directory / RUN_FILE)
    if record is not None and record.get("fingerprint") != run.fingerprint:
        raise UserError(
            f"--output: {run.directory} holds a finished run of {run.label} made with different settings; "
            "use a new --output directory or delete that run"
        )


def execute(run: Run, threads: Optional[int], log: Any = print, parallel: int = 1) -> dict:
    """Run one training subprocess to the end; never raises for the run's own failure."""
    if run.directory.exists():
        shutil.rmtree(run.directory)  # an unfinished earlier attempt: start it afresh
    run.directory.mkdir(parents=True)
    record = {
        "variant": run.variant.name,
        "seed": run.seed,
        "fingerprint": run.fingerprint,
        "command": run.command,
        "parallel": parallel,  # runs sharing the machine with this one: the table says so
        "status": "running",
    }
    _write_json(run.directory / RUN_FILE, record)
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if threads is not None:  # parallel runs share the cores instead of fighting over them
        env.setdefault("OMP_NUM_THREADS", str(threads))
    log(f"ablate: start  {run.label}")
    start = time.perf_counter()
    with open(run.directory / LOG_FILE, "w", encoding="utf-8") as out:
        process = subprocess.run(run.command, stdout=out, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
    record["process_seconds"] = time.perf_counter() - start
    record["returncode"] = process.returncode
    if process.returncode == 0 and is_finished(run):
        record["status"] = "ok"
    else:
        if is_finished(run):  # it died after training (final validation, say): not finished
            os.replace(run.directory / SUMMARY_FILE, run.directory / ("failed-" + SUMMARY_FILE))
        text = (run.directory / LOG_FILE).read_text(encoding="utf-8", errors="replace")
        reason = last_line(text) or f"exit status {process.returncode}"
        if process.returncode == 0:
            reason = f"training ended without writing {SUMMARY_FILE}; last line: {reason}"
        record["status"], record["error"] = "failed", reason
    _write_json(run.directory / RUN_FILE, record)
    log(f"ablate: {record['status']:<6} {run.label} ({record['process_seconds']:.0f} s)" + (f": {record.get('error')}" if record.get("error") else ""))
    return record


def run_sweep(runs: list[Run], sweep: Sweep, output: Path, parallel: int = 1, log: Any = print) -> None:
    """Run every unfinished run; finished ones are skipped (after checking their settings)."""
    todo = []
    for run in runs:
        if is_finished(run):
            check_same_settings(run)
            log(f"ablate: skip   {run.label} (finished)")
        else:
            todo.append(run)
    if not todo:
        return
    output.mkdir(parents=True, exist_ok=True)
    snapshot = output / BASE_SNAPSHOT
    snapshot.with_suffix(".tmp").write_text(sweep.base_text, encoding="utf-8")
    os.replace(snapshot.with_suffix(".tmp"), snapshot)
    threads = max(1, (os.cpu_count() or 1) // parallel) if parallel > 1 else None
    if parallel == 1:
        for run in todo:
            execute(run, threads, log)
    else:
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            list(pool.map(lambda run: execute(run, threads, log, parallel), todo))


# ------------------------------------------------------------------------------ the run's own numbers

try:
    from lightning.pytorch.callbacks import Callback as _Callback
except ImportError:  # pragma: no cover - Lightning is a dependency; keeps results readable without it
    _Callback = object


def _metric(metrics: dict, names: Sequence[str]) -> Optional[float]:
    for name in names:
        if name in metrics:
            return float(metrics[name])
    return None


VAL_LOSS_NAMES = ("val_loss", "val/loss")
VAL_ACCURACY_NAMES = ("val_accuracy", "val/accuracy", "val_toy_accuracy", "val/toy_accuracy")


class RunSummary(_Callback):
    """Writes <run dir>/summary.json at the end of training: what the ablation table needs.

    - tokens seen: counted from the batches themselves (all ranks, padding included);
    - tokens/s: tokens over the time spent inside training steps (forward, backward, optimiser),
      from the second step on (the first pays one-off set-up); data loading and validation excluded;
    - peak memory: on CUDA torch.cuda.max_memory_allocated; on CPU the process's peak resident set
      size (resource.getrusage), which includes Python, torch and the data, not only the model;
    - the validation curve: val loss (and exact-match accuracy when logged) at every validation,
      against tokens seen.

    `path`: where to write; default <trainer.default_root_dir>/summary.json.
    """

    def __init__(self, path: Optional[str] = None):
        super().__init__()
        self.path = path
        self.tokens = 0
        self.timed_tokens = 0
        self.timed_seconds = 0.0
        self.curve: list[dict] = []
        self._step_start = 0.0
        self._fit_start = 0.0

    @staticmethod
    def _sync(pl_module) -> None:
        import torch

        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_fit_start(self, trainer, pl_module) -> None:
        import torch

        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)
        self._fit_start = time.perf_counter()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._sync(pl_module)
        self._step_start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._sync(pl_module)
        seconds = time.perf_counter() - self._step_start
        inputs = batch[0] if isinstance(batch, (tuple, list)) else batch
        tokens = int(inputs.numel()) * trainer.world_size
        self.tokens += tokens
        if trainer.global_step > 1:  # skip the first optimiser step: allocation, compilation
            self.timed_tokens += tokens
            self.timed_seconds += seconds

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        metrics = trainer.callback_metrics
        loss = _metric(metrics, VAL_LOSS_NAMES)
        if loss is None or (self.curve and self.curve[-1]["step"] == trainer.global_step):
            return
        point = {"step": int(trainer.global_step), "tokens": self.tokens, "val_loss": loss}
        accuracy = _metric(metrics, VAL_ACCURACY_NAMES)
        if accuracy is not None:
            point["val_accuracy"] = accuracy
        self.curve.append(point)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        # After fit, and again after a final trainer.validate (the train command runs one when
        # the last step was not a validation step): the last write has the whole curve.
        if stage in ("fit", "validate") and self.tokens > 0:
            self.write(trainer, pl_module)

    def write(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        import torch

        from .cache import kv_cache_bytes
        from .model import Transformer

        model = next((m for m in pl_module.modules() if isinstance(m, Transformer)), None)
        if pl_module.device.type == "cuda":
            peak, memory_kind = torch.cuda.max_memory_allocated(pl_module.device), "cuda max allocated"
        else:
            # ru_maxrss is in kilobytes on Linux, bytes on macOS.
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            peak, memory_kind = rss * (1 if sys.platform == "darwin" else 1024), "cpu peak RSS"
        summary: dict[str, Any] = {
            "status": "ok",
            "steps": int(trainer.global_step),
            "tokens_seen": self.tokens,
            "tokens_per_s": self.timed_tokens / self.timed_seconds if self.timed_seconds > 0 else None,
            "train_seconds": time.perf_counter() - self._fit_start,
            "peak_memory_bytes": int(peak),
            "memory_kind": memory_kind,
            "device": str(pl_module.device),
            "curve": self.curve,
        }
        if model is not None:
            config = model.config
            summary["params"] = model.num_params()
            summary["block_size"] = config.block_size
            summary["kv_bytes_per_token"] = kv_cache_bytes(config, config.block_size) / config.block_size
            summary["model_config"] = config.to_dict()
        losses = [p["val_loss"] for p in self.curve]
        if losses:
            summary["final_val_loss"] = losses[-1]
            summary["best_val_loss"] = min(losses)
            summary["final_val_step"] = self.curve[-1]["step"]
        accuracies = [p["val_accuracy"] for p in self.curve if "val_accuracy" in p]
        if accuracies:
            summary["final_val_accuracy"] = accuracies[-1]
            summary["best_val_accuracy"] = max(accuracies)
        path = Path(self.path) if self.path else Path(trainer.default_root_dir) / SUMMARY_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_json(path, summary)


# ------------------------------------------------------------------------------ results

# (column in results.csv, heading in results.md, format, higher is better?)
COLUMNS = [
    ("params", "params", "{:,.0f}", None),
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


def _read_json(path: Path) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
    os.replace(tmp, path)  # readers never see half a file


def collect(runs: list[Run]) -> list[dict]:
    """One row per run: its status and numbers (None where a run has none)."""
    rows = []
    for run in runs:
        record = _read_json(run.directory / RUN_FILE) or {}
        summary = _read_json(run.directory / SUMMARY_FILE)
        row: dict[str, Any] = {"variant": run.variant.name, "seed": run.seed}
        if summary is not None:
            row["status"], row["error"] = "ok", ""
        elif record.get("status") == "failed":
            row["status"], row["error"] = "failed", record.get("error", "")
        else:
            row["status"], row["error"] = "not run", ""
        summary = summary or {}
        final = summary.get("final_val_loss")
        row.update(
            params=summary.get("params"),
            final_val_loss=final,
            best_val_loss=summary.get("best_val_loss"),
            val_perplexity=math.exp(final) if final is not None and final < 50 else None,
            val_accuracy=summary.get("final_val_accuracy"),
            tokens_per_s=summary.get("tokens_per_s"),
            peak_memory_mb=summary["peak_memory_bytes"] / 2**20 if summary.get("peak_memory_bytes") else None,
            memory_kind=summary.get("memory_kind"),
            kv_bytes_per_token=summary.get("kv_bytes_per_token"),
            wall_time_s=summary.get("train_seconds"),
            process_seconds=record.get("process_seconds"),
            parallel=record.get("parallel", 1),
            tokens_seen=summary.get("tokens_seen"),
            steps=summary.get("steps"),
            device=summary.get("device"),
            budget_changes=json.dumps(run.variant.budget_changes()) if run.variant.budget_changes() else "",
            run_dir=str(run.directory),
            curve=summary.get("curve", []),
        )
        rows.append(row)
    return rows


def mean_std(values: list[float]) -> tuple[Optional[float], Optional[float]]:
    """Mean and sample standard deviation (None for one value: no spread to report)."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def aggregate(rows: list[dict]) -> list[dict]:
    """Per variant, in sweep order: mean and std of every column over its finished seeds."""
    by_variant: dict[str, list[dict]] = {}
    for row in rows:
        by_variant.setdefault(row["variant"], []).append(row)
    table = []
    for name, runs in by_variant.items():
        ok = [r for r in runs if r["status"] == "ok"]
        entry: dict[str, Any] = {"variant": name, "runs": len(runs), "ok": len(ok), "budget_changes": runs[0]["budget_changes"]}
        failed = [r for r in runs if r["status"] == "failed"]
        if failed:
            entry["status"] = f"{len(failed)}/{len(runs)} failed: {failed[0]['error']}"
        elif len(ok) < len(runs):
            entry["status"] = f"{len(runs) - len(ok)}/{len(runs)} not run"
        else:
            entry["status"] = "ok"
        for key, *_ in COLUMNS:
            entry[key] = mean_std([r[key] for r in ok])
        entry["curve"] = mean_curve([r["curve"] for r in ok])
        memory_kinds = {r["memory_kind"] for r in ok if r["memory_kind"]}
        entry["memory_kind"] = ", ".join(sorted(memory_kinds))
        table.append(entry)
    return table


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


CSV_FIELDS = [
    "variant", "seed", "status", "error", "params", "final_val_loss", "best_val_loss", "val_perplexity",
    "val_accuracy", "tokens_per_s", "peak_memory_mb", "memory_kind", "kv_bytes_per_token", "wall_time_s", "process_seconds",
    "tokens_seen", "steps", "device", "parallel", "budget_changes", "run_dir",
]


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in CSV_FIELDS})


def format_cell(mean: Optional[float], std: Optional[float], fmt: str) -> str:
    if mean is None:
        return "–"
    text = fmt.format(mean)
    return text if std is None else f"{text} ± {fmt.format(std)}"


def markdown_table(table: list[dict], title: str = "", notes: Sequence[str] = ()) -> str:
    columns = [c for c in COLUMNS if any(entry[c[0]][0] is not None for entry in table)]
    header = ["variant", *(heading for _, heading, _, _ in columns), "seeds", "status"]
    lines = [f"# {title}", ""] if title else []
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for entry in table:
        name = entry["variant"] + (" †" if entry["budget_changes"] else "")
        cells = [format_cell(*entry[key], fmt) for key, _, fmt, _ in columns]
        status = entry["status"].replace("|", "\\|")
        lines.append("| " + " | ".join([name, *cells, f"{entry['ok']}/{entry['runs']}", status]) + " |")
    lines.append("")
    changed = [e for e in table if e["budget_changes"]]
    for entry in changed:
        lines.append(f"† {entry['variant']} changes the shared budget/data: {entry['budget_changes']}")
    if changed:
        lines.append("")
    lines += [f"- {note}" for note in notes]
    return "\n".join(lines).rstrip() + "\n"


def write_results(runs: list[Run], output: Path, notes: Sequence[str] = (), title: str = "Ablation") -> list[dict]:
    from . import plots

    rows = collect(runs)
    table = aggregate(rows)
    write_csv(rows, output / "results.csv")
    kinds = sorted({r["memory_kind"] for r in rows if r.get("memory_kind")})
    devices = sorted({r["device"] for r in rows if r.get("device")})
    standard = [
        "mean ± sample std over seeds; a value without ± comes from one seed",
        "tokens/s: training steps only (forward, backward, optimiser), from the second step on",
        f"peak memory: {', '.join(kinds) or 'n/a'} (CPU peak RSS is the whole process: Python, torch, data)",
        "KV cache B/token: minitx.kv_cache_bytes(config, block_size) / block_size, float32, batch 1",
        "wall time: the training loop (fit) of one run, validation included",
        f"device: {', '.join(devices) or 'n/a'}",
    ]
    parallel = max((r["parallel"] or 1 for r in rows if r["status"] == "ok"), default=1)
    if parallel > 1:
        notes = [f"runs went up to {parallel} at a time, sharing the machine: tokens/s and wall times are lower than alone", *notes]
    budgets = {entry["variant"]: entry["tokens_seen"][0] for entry in table if entry["tokens_seen"][0] is not None}
    if len(set(budgets.values())) > 1:  # a budget change slipped through (or was allowed): say so
        notes = [f"the variants did not all see the same number of tokens: {budgets}", *notes]
    (output / "results.md").write_text(markdown_table(table, title, [*standard, *notes]), encoding="utf-8")
    plots.loss_curves(table, output / "loss_curves.png")
    plots.cost_quality(table, output / "cost_quality.png")
    return table


# ------------------------------------------------------------------------------ command line


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = ArgumentParser(
        prog="ablate",
        description="Train each attention variant of a sweep file on the same data and budget; write a table and plots.",
    )
    parser.add_argument("--config", required=True, help="sweep YAML: base training config + variants")
    parser.add_argument("--output", default=None, help="output directory (default runs/ablation/<config name>)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per variant (default: the file's 'seeds')")
    parser.add_argument("--parallel", type=int, default=1, help="training processes at once (default 1)")
    parser.add_argument("--only", default=None, help="comma-separated variant names to run (default all)")
    parser.add_argument("--wandb", action="store_true", help="log every run to Weights & Biases, one group per sweep")
    parser.add_argument("--wandb-project", default="minitx-ablation", help="W&B project (with --wandb)")
    parser.add_argument("--dry-run", action="store_true", help="print the training commands and stop")
    parser.add_argument("--report-only", action="store_true", help="rebuild the table and plots from finished runs")
    parser.add_argument("train_args", nargs="*", help="extra training arguments for every run, after --")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    if args.seeds is not None and args.seeds < 1:
        raise UserError(f"--seeds: must be 1 or more, got {args.seeds}")
    if args.parallel < 1:
        raise UserError(f"--parallel: must be 1 or more, got {args.parallel}")
    config_path = Path(args.config)
    output = Path(args.output) if args.output else Path("runs") / "ablation" / config_path.stem
    sweep = load_sweep(config_path)
    if args.only:
        wanted = [name.strip() for name in args.only.split(",") if name.strip()]
        missing = sorted(set(wanted) - {v.name for v in sweep.variants})
        if missing:
            raise UserError(f"--only: unknown variant(s) {', '.join(missing)}; the file has {', '.join(v.name for v in sweep.variants)}")
        sweep.variants = [v for v in sweep.variants if v.name in wanted]
    if not args.report_only:
        check_variants(sweep, config_path, args.train_args)
    output.mkdir(parents=True, exist_ok=True)  # only once the sweep is known to be sound
    logging = wandb_arguments(args.wandb_project, group=output.resolve().name) if args.wandb else []
    runs = plan_runs(sweep, output, args.seeds or sweep.seeds, args.train_args, logging)
    if args.dry_run:
        for run in runs:
            print(" ".join(_quote(part) for part in run.command))
        print(f"# {output / BASE_SNAPSHOT} is written when the sweep runs: the base config as it is then")
        return
    if not args.report_only:
        run_sweep(runs, sweep, output, args.parallel)
    table = write_results(runs, output, title=f"Ablation: {config_path.name}")
    print((output / "results.md").read_text(encoding="utf-8"))
    print(f"ablate: wrote {output / 'results.md'}, results.csv, loss_curves.png, cost_quality.png")
    if all(entry["ok"] == 0 for entry in table):
        failed = next((entry for entry in table if entry["status"] != "ok"), None)
        first = f" ({failed['variant']}: {failed['status']})" if failed else ""
        raise UserError(f"every run failed{first}; see the status column in {output / 'results.md'} and each run's {LOG_FILE}")


def wandb_arguments(project: str, group: str) -> list[str]:
    return ["--run.wandb", "true", "--run.wandb_project", project, "--run.wandb_group", group]


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)
