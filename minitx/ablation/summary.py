"""RunSummary: the callback the sweep adds to every training run (the training subprocess loads it
by name, `--trainer.callbacks+=minitx.ablation.summary.RunSummary`). It writes summary.json when
training ends: what the ablation table needs of one run."""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from ..cache import kv_cache_bytes
from ..files.atomic import write_json_atomically
from ..model import Transformer
from .plan.budget import model_budget
from .runs.runner import SUMMARY_FILE


def _logged(trainer, name: str) -> float | None:
    value = trainer.callback_metrics.get(name)
    return None if value is None else float(value)


def _peak_memory(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda max allocated"
    # ru_maxrss is in kilobytes on Linux, bytes on macOS.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss * (1 if sys.platform == "darwin" else 1024)), "cpu peak RSS"


class RunSummary(Callback):
    """Writes <run dir>/summary.json at the end of training.

    - tokens seen and tokens/s: read from the training module's own meter (`MinitxLM.throughput`,
      the one that gives the logged tokens_per_sec): tokens of all ranks; training steps only, from
      the end of the first step, validation left out; over the whole run;
    - peak memory: on CUDA torch.cuda.max_memory_allocated; on CPU the process's peak resident set
      size (resource.getrusage), which includes Python, torch and the data, not only the model;
    - the model's budget: parameters (total and without the embedding tables) and training FLOPs
      per token (budget.py);
    - the validation curve: val loss (and exact-match accuracy when logged) at every validation,
      against tokens seen.

    `path`: where to write; default <trainer.default_root_dir>/summary.json.
    """

    def __init__(self, path: str | None = None):
        super().__init__()
        self.path = path
        self.curve: list[dict] = []
        self._fit_start = 0.0
        # What the attempts before a resume trained (a requeued run resumes from last.ckpt): the
        # module's meter counts from this attempt's start, the summary from the run's.
        self._tokens_before = 0
        self._seconds_before = 0.0
        self._module = None

    def _tokens(self, pl_module) -> int:
        meter = getattr(pl_module, "throughput", None)
        return self._tokens_before + (meter.tokens_seen if meter is not None else 0)

    def state_dict(self) -> dict[str, Any]:
        """Saved in every checkpoint, so that a resumed run's summary covers the whole run."""
        tokens = self._tokens(self._module) if self._module is not None else self._tokens_before
        seconds = self._seconds_before + (time.perf_counter() - self._fit_start if self._fit_start else 0.0)
        return {"curve": list(self.curve), "tokens": tokens, "train_seconds": seconds}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.curve = list(state_dict.get("curve", []))
        self._tokens_before = int(state_dict.get("tokens", 0))
        self._seconds_before = float(state_dict.get("train_seconds", 0.0))

    def on_fit_start(self, trainer, pl_module) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)
        self._fit_start = time.perf_counter()
        self._module = pl_module

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        loss = _logged(trainer, "val_loss")
        if loss is None or (self.curve and self.curve[-1]["step"] == trainer.global_step):
            return
        point = {"step": int(trainer.global_step), "tokens": self._tokens(pl_module), "val_loss": loss}
        accuracy = _logged(trainer, "val_accuracy")
        if accuracy is not None:
            point["val_accuracy"] = accuracy
        self.curve.append(point)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        # After fit, and again after a final trainer.validate (the train command runs one when
        # the last step was not a validation step): the last write has the whole curve.
        if stage in ("fit", "validate") and self._tokens(pl_module) > 0 and trainer.is_global_zero:
            write_json_atomically(self._path(trainer), self.summary(trainer, pl_module))

    def _path(self, trainer) -> Path:
        return Path(self.path) if self.path else Path(trainer.default_root_dir) / SUMMARY_FILE

    def summary(self, trainer, pl_module) -> dict[str, Any]:
        peak, memory_kind = _peak_memory(pl_module.device)
        meter = pl_module.throughput
        summary: dict[str, Any] = {
            "status": "ok",
            "steps": int(trainer.global_step),
            "tokens_seen": self._tokens(pl_module),
            "tokens_per_s": meter.mean_tokens_per_sec,  # of the last attempt where a run resumed
            "train_seconds": self._seconds_before + time.perf_counter() - self._fit_start,
            "peak_memory_bytes": peak,
            "memory_kind": memory_kind,
            "device": str(pl_module.device),
            "curve": self.curve,
        }
        model = next((m for m in pl_module.modules() if isinstance(m, Transformer)), None)
        if model is not None:
            config = model.config
            summary.update(model_budget(model))
            summary["block_size"] = config.block_size
            summary["kv_bytes_per_token"] = kv_cache_bytes(config, config.block_size) / config.block_size
            summary["model_config"] = config.to_dict()
        losses = [p["val_loss"] for p in self.curve]
        if losses:
            summary.update(
                final_val_loss=losses[-1], best_val_loss=min(losses), final_val_step=self.curve[-1]["step"]
            )
        accuracies = [p["val_accuracy"] for p in self.curve if "val_accuracy" in p]
        if accuracies:
            summary.update(final_val_accuracy=accuracies[-1], best_val_accuracy=max(accuracies))
        return summary
