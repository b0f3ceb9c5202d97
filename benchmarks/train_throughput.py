"""Training throughput: the Lightning loop (MinitxLM + Trainer) against a bare PyTorch loop.

Both train the same model on the same batches with the same optimiser groups, schedule and
gradient clipping; only the loop differs. Measurements alternate (Lightning, bare, Lightning,
bare, ...) so that a machine that speeds up or slows down during the run affects both alike, and
each measurement skips its first steps (allocation, warm-up). Reported: median tokens/s of each
and their ratio (Lightning / bare).

    python benchmarks/train_throughput.py                          # configs/default.yaml's model
    python benchmarks/train_throughput.py --rounds 5 --steps 40 --config configs/gqa.yaml
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minitx.data.datamodule import TextDataModule  # noqa: E402
from minitx.files.configs import DEFAULT_CONFIG, merged_config  # noqa: E402
from minitx.training import MinitxLM, lm_loss, lr_at, optimizer_groups  # noqa: E402


class StepTimer(L.Callback):
    """Wall time from the start of step `skip` to the end of the last step."""

    def __init__(self, skip: int):
        self.skip = skip
        self.start = None
        self.end = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.skip and self.start is None:
            self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.end = time.perf_counter()


def build(config: dict, steps: int) -> tuple[MinitxLM, TextDataModule]:
    L.seed_everything(config.get("seed_everything", 1337), verbose=False)
    model_args = dict(config["model"])
    data_args = {**config.get("data", {}), "block_size": model_args.get("block_size", 256), "num_workers": 0}
    data = TextDataModule(**data_args)
    data.setup("fit")
    model = MinitxLM(**model_args, vocab_size=data.vocab_size, max_steps=steps)
    return model, data


def lightning_tokens_per_sec(config: dict, steps: int, skip: int, clip: float, workdir: str) -> float:
    model, data = build(config, steps)
    timer = StepTimer(skip)
    trainer = L.Trainer(
        max_steps=steps,
        accelerator="cpu" if not torch.cuda.is_available() else "auto",
        devices=1,
        logger=CSVLogger(workdir, name="bench"),  # as in a real run: metrics written every log_every_n_steps
        enable_checkpointing=False,
        enable_autolog_hparams=False,  # as train.py: the two vocab_size hparams would clash
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        gradient_clip_val=clip,
        log_every_n_steps=10,
        default_root_dir=workdir,
        callbacks=[timer],
    )
    trainer.fit(model, datamodule=data)
    tokens = (steps - skip) * data.batch_size * data.block_size
    return tokens / (timer.end - timer.start)


def bare_tokens_per_sec(config: dict, steps: int, skip: int, clip: float) -> float:
    module, data = build(config, steps)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = module.model.to(device).train()
    hp = module.hparams
    optimizer = torch.optim.AdamW(
        optimizer_groups(list(model.named_parameters()), hp.weight_decay),
        lr=hp.lr,
        betas=tuple(hp.betas),
        eps=hp.eps,
        fused=device.type == "cuda",
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_at(s, hp.lr, hp.min_lr, hp.warmup_steps, steps) / hp.lr
    )
    batches = iter(data.train_dataloader())
    start = None
    for step in range(steps):
        if step == skip:
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        x, y = (t.to(device, non_blocking=True) for t in next(batches))
        loss = lm_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        scheduler.step()
        loss.item()  # the Lightning loop reads the loss every step (logging, NaN check): so does this one
    if device.type == "cuda":
        torch.cuda.synchronize()
    tokens = (steps - skip) * data.batch_size * data.block_size
    return tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config", default=str(DEFAULT_CONFIG), help="training config whose model and data are used"
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating measurement pairs")
    parser.add_argument("--steps", type=int, default=40, help="optimiser steps per measurement")
    parser.add_argument("--skip", type=int, default=5, help="first steps of each measurement left untimed")
    args = parser.parse_args()

    config = merged_config(args.config)  # a kind's config is an overlay on default.yaml
    clip = float(config.get("trainer", {}).get("gradient_clip_val") or 1.0)
    print(
        f"torch {torch.__version__}, lightning {L.__version__}, threads {torch.get_num_threads()}, config {args.config}"
    )
    lightning_runs, bare_runs = [], []
    with tempfile.TemporaryDirectory() as workdir:
        for round_index in range(args.rounds):
            # Alternate which loop goes first, so neither always runs on a warmer machine.
            order = ("lightning", "bare") if round_index % 2 == 0 else ("bare", "lightning")
            for loop in order:
                if loop == "lightning":
                    lightning_runs.append(
                        lightning_tokens_per_sec(config, args.steps, args.skip, clip, workdir)
                    )
                else:
                    bare_runs.append(bare_tokens_per_sec(config, args.steps, args.skip, clip))
            print(
                f"round {round_index + 1}: lightning {lightning_runs[-1]:,.0f} tok/s, bare {bare_runs[-1]:,.0f} tok/s"
            )
    lightning_median, bare_median = statistics.median(lightning_runs), statistics.median(bare_runs)
    print(
        f"median tokens/s: lightning {lightning_median:,.0f}, bare PyTorch {bare_median:,.0f}, ratio {lightning_median / bare_median:.3f}"
    )


if __name__ == "__main__":
    main()
