"""Muon against AdamW on the default run: the val loss curves, the step time, and the val loss at
equal wall time.

Two copies of a config's model (configs/default.yaml by default) start from the same weights and
train on the same batches in the same order, one step of each in turn (AdamW, Muon, AdamW, ...),
so that a machine whose speed changes during the run (other processes on a shared CPU) slows
both alike. Each steps through minitx's own optimiser code (MinitxLM.configure_optimizers: the
optimiser, its LambdaLR schedule) with gradient clipping at the config's gradient_clip_val, as a
run of `python train.py` does. Validation (the config's val_batches, the same for both) is not
timed. Reported: val loss at every --val-every steps, mean and median step time of each and
their ratio, and the equal-time comparison: the slower optimiser trained again, alone, for the
steps it can take in the faster one's time (a whole schedule of that length, as a run with that
trainer.max_steps would be), and its final val loss.

    python benchmarks/optimizers.py                                # 1000 steps, validation every 100
    python benchmarks/optimizers.py --steps 200 --val-every 50 --schedule wsd
    python benchmarks/optimizers.py --newton-schulz        # the iteration alone, per shape

--newton-schulz: Newton-Schulz alone on the stacks BatchedMuon orthogonalises for the config's
model (one per shape, tall ones turned), in float32 and in bfloat16
(model.optimizer_options.muon.precision), timed in turn on one thread (median thread-CPU time), with each one's largest error against a float64 run, on
Gaussian updates and on updates whose singular values span nine orders of magnitude (as
gradients, near low rank).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import lightning as L
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minitx.data.datamodule import TextDataModule  # noqa: E402
from minitx.files.configs import DEFAULT_CONFIG, merged_config  # noqa: E402
from minitx.training import MinitxLM, lm_loss  # noqa: E402
from minitx.training.optim import MUON_DTYPES, MUON_PRECISIONS, BatchedMuon, muon_matrix, newton_schulz  # noqa: E402

SHAPES_VOCAB = 65  # --newton-schulz builds the model for its shapes only
SKIP = 10  # first steps of each optimiser left out of the step time (allocation, warm-up)


class Run:
    """One model, its optimiser and schedule as configure_optimizers makes them, and its times."""

    def __init__(self, name: str, config: dict, data: TextDataModule, steps: int, clip: float):
        L.seed_everything(config.get("seed_everything", 1337), verbose=False)  # the same initial weights
        self.name, self.clip = name, clip
        self.module = MinitxLM(**config["model"], vocab_size=data.vocab_size, max_steps=steps)
        self.model = self.module.model.train()
        setup = self.module.configure_optimizers()
        self.optimizer = setup["optimizer"]
        self.scheduler = setup["lr_scheduler"]["scheduler"]
        self.step_times: list[float] = []
        self.val: dict[int, float] = {}

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        start = time.perf_counter()
        loss = lm_loss(self.model(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.scheduler.step()
        loss.item()  # the Lightning loop reads the loss every step: so does this one
        self.step_times.append(time.perf_counter() - start)

    @torch.no_grad()
    def validate(self, batches: list[tuple[torch.Tensor, torch.Tensor]], step: int) -> None:
        self.model.eval()
        losses = [lm_loss(self.model(x), y) for x, y in batches]
        self.model.train()
        self.val[step] = float(torch.stack(losses).mean())  # as MinitxLM: the mean of batch means

    def mean_step(self) -> float:
        return statistics.fmean(self.step_times[SKIP:])

    def median_step(self) -> float:
        return statistics.median(self.step_times[SKIP:])


def time_muon_steps(module: MinitxLM, repeats: int = 20) -> tuple[float, float]:
    """ms per step of torch.optim.Muon and of minitx's BatchedMuon on the model's Muon matrices
    (random gradients), measured in turn: what orthogonalising same-shaped matrices together saves."""
    params = [
        torch.nn.Parameter(p.detach().clone())
        for n, p in module.model.named_parameters()
        if muon_matrix(n, p)
    ]
    for param in params:
        param.grad = torch.randn_like(param)
    optimizers = {"torch": torch.optim.Muon(params, lr=1e-4), "batched": BatchedMuon(params, lr=1e-4)}
    times: dict[str, list[float]] = {name: [] for name in optimizers}
    for _ in range(repeats):
        for name, optimizer in optimizers.items():
            start = time.perf_counter()
            optimizer.step()
            times[name].append(time.perf_counter() - start)
    return statistics.median(times["torch"]) * 1e3, statistics.median(times["batched"]) * 1e3


def newton_schulz_table(module: MinitxLM, repeats: int = 21) -> None:
    """Newton-Schulz per stack in float32 and bfloat16: time and error (module doc)."""
    group = module.configure_optimizers()["optimizer"].muon.param_groups[0]
    coefficients, steps = group["ns_coefficients"], group["ns_steps"]
    shapes = Counter(tuple(p.shape) for n, p in module.model.named_parameters() if muon_matrix(n, p))
    print(f"Newton-Schulz, {steps} steps, coefficients {coefficients}, {torch.get_num_threads()} thread(s)")
    print(
        "| stack | float32 ms | bfloat16 ms | ratio | error vs float64: float32 / bfloat16, Gaussian | ill-conditioned |"
    )
    print("|---|---:|---:|---:|---|---|")
    generator = torch.Generator().manual_seed(0)
    dtypes = MUON_DTYPES
    totals = dict.fromkeys(dtypes, 0.0)
    for (rows, columns), count in shapes.items():
        r, c = min(rows, columns), max(rows, columns)  # as orthogonalise turns tall matrices
        errors = []
        for spread in (0.0, 9.0):
            x = torch.randn(count, r, c, dtype=torch.float64, generator=generator)
            if spread:
                u, _ = torch.linalg.qr(torch.randn(count, r, r, dtype=torch.float64, generator=generator))
                v, _ = torch.linalg.qr(torch.randn(count, c, r, dtype=torch.float64, generator=generator))
                x = (u * torch.logspace(0, -spread, r, dtype=torch.float64)) @ v.mT
            x = x / x.norm(dim=(-2, -1), keepdim=True)
            reference = newton_schulz(x, coefficients, steps)
            for dtype in dtypes.values():
                errors.append(
                    float((newton_schulz(x.to(dtype), coefficients, steps).double() - reference).abs().max())
                )
        x = torch.randn(count, r, c, generator=generator)
        x = x / x.norm(dim=(-2, -1), keepdim=True)
        times: dict[str, list[float]] = {key: [] for key in dtypes}
        for _ in range(repeats):
            for key, dtype in dtypes.items():
                cast = x.to(dtype)
                start = time.thread_time()
                newton_schulz(cast, coefficients, steps)
                times[key].append(time.thread_time() - start)
        f32, bf16 = (statistics.median(times[key]) * 1e3 for key in dtypes)
        totals["float32"] += f32
        totals["bfloat16"] += bf16
        print(
            f"| {count} x {rows} x {columns} | {f32:.2f} | {bf16:.2f} | {bf16 / f32:.2f} | "
            f"{errors[0]:.1e} / {errors[1]:.1e} | {errors[2]:.1e} / {errors[3]:.1e} |"
        )
    f32, bf16 = totals.values()
    print(f"| all | {f32:.2f} | {bf16:.2f} | {bf16 / f32:.2f} | | |")


def with_optimizer(config: dict, optimizer: str, args: argparse.Namespace) -> dict:
    model = {**config["model"], "optimizer": optimizer}
    if args.schedule:
        model["schedule"] = args.schedule
    if optimizer == "muon":
        own = {"lr": args.muon_lr, "precision": args.muon_precision}
        options = dict(model.get("optimizer_options") or {})
        options["muon"] = {**(options.get("muon") or {}), **{k: v for k, v in own.items() if v is not None}}
        model["optimizer_options"] = options
    return {**config, "model": model}


def train(runs: list[Run], data: TextDataModule, steps: int, val_every: int, val_batches: list) -> None:
    """`runs` in turn, one step each, on the same batches; validated every val_every steps and at the end."""
    batches = iter(data.train_dataloader())
    for step in range(1, steps + 1):
        x, y = next(batches)
        for run in runs if step % 2 else reversed(runs):  # neither always goes first
            run.step(x, y)
        if step % val_every == 0 or step == steps:
            for run in runs:
                run.validate(val_batches, step)
            print(f"step {step}: " + ", ".join(f"{r.name} val {r.val[step]:.4f}" for r in runs), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config", default=str(DEFAULT_CONFIG), help="training config whose model and data are used"
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="optimiser steps (default: the config's max_steps)"
    )
    parser.add_argument("--val-every", type=int, default=100, help="steps between validations")
    parser.add_argument(
        "--schedule", choices=("cosine", "wsd"), default=None, help="both runs' model.schedule"
    )
    parser.add_argument(
        "--muon-lr",
        type=float,
        default=None,
        help="Muon's model.optimizer_options.muon.lr (default: the config's)",
    )
    parser.add_argument(
        "--muon-precision",
        choices=MUON_PRECISIONS,
        default=None,
        help="Muon's model.optimizer_options.muon.precision (default: the config's)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument(
        "--newton-schulz",
        action="store_true",
        help="time the iteration alone per shape (module doc), then stop",
    )
    parser.add_argument(
        "--no-equal-time", action="store_true", help="skip the third run (the slower optimiser at equal time)"
    )
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    config = merged_config(args.config)
    if args.newton_schulz:
        # Thread-CPU time counts the calling thread only: one thread, so that it is all the work.
        # The Muon matrices' shapes do not depend on the vocabulary: no data is read.
        torch.set_num_threads(1)
        model = with_optimizer(config, "muon", args)["model"]
        newton_schulz_table(MinitxLM(**model, vocab_size=SHAPES_VOCAB, max_steps=1))
        return
    steps = args.steps or int(config.get("trainer", {}).get("max_steps", 1000))
    clip = float(config.get("trainer", {}).get("gradient_clip_val") or 1.0)
    data_args = {
        **config.get("data", {}),
        "block_size": config["model"].get("block_size", 256),
        "num_workers": 0,
    }
    L.seed_everything(config.get("seed_everything", 1337), verbose=False)
    data = TextDataModule(**data_args)
    data.setup("fit")
    val_batches = list(data.val_dataloader())
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, config {args.config}, {steps} steps, "
        f"{data.batch_size} x {data.block_size} tokens a step, gradient clipping {clip}"
    )

    runs = [Run(name, with_optimizer(config, name, args), data, steps, clip) for name in ("adamw", "muon")]
    plain, batched = time_muon_steps(runs[1].module)
    print(
        f"Muon's step on the {sum(muon_matrix(n, p) for n, p in runs[1].module.model.named_parameters())} hidden matrices (median of 20, in turn): "
        f"torch.optim.Muon {plain:.1f} ms, minitx's BatchedMuon {batched:.1f} ms"
    )
    for run in runs:
        hp = run.module.hparams
        lrs = ", ".join(f"{g['lr']:g}" for g in run.optimizer.param_groups)
        print(
            f"{run.name}: {type(run.optimizer).__name__}, group lrs {lrs}, schedule {hp.schedule}, muon precision {run.module.optimisation.optimizer_options.muon.precision}"
        )
    train(runs, data, steps, args.val_every, val_batches)
    adamw, muon = runs

    print("\nval loss by step")
    print("| step | AdamW | Muon |\n|---|---|---|")
    for step in sorted(adamw.val):
        print(f"| {step} | {adamw.val[step]:.4f} | {muon.val[step]:.4f} |")
    ratio = muon.mean_step() / adamw.mean_step()
    print(
        f"\nstep time (mean of steps {SKIP + 1}-{steps}, alternating): AdamW {adamw.mean_step() * 1e3:.1f} ms, "
        f"Muon {muon.mean_step() * 1e3:.1f} ms, ratio {ratio:.3f} "
        f"(medians {adamw.median_step() * 1e3:.1f} / {muon.median_step() * 1e3:.1f} ms, "
        f"ratio {muon.median_step() / adamw.median_step():.3f})"
    )
    if args.no_equal_time:
        return
    faster, slower = (adamw, muon) if ratio > 1 else (muon, adamw)
    equal_steps = math.floor(steps * faster.mean_step() / slower.mean_step())
    print(
        f"\nequal wall time: {slower.name} in {faster.name}'s time for {steps} steps takes {equal_steps} steps; "
        f"training it alone for {equal_steps} steps (its schedule {equal_steps} steps long)",
        flush=True,
    )
    again = Run(slower.name, with_optimizer(config, slower.name, args), data, equal_steps, clip)
    train([again], data, equal_steps, args.val_every, val_batches)
    print(
        f"\nat equal wall time ({faster.name}'s {steps} steps): {faster.name} val {faster.val[steps]:.4f} "
        f"after {steps} steps, {slower.name} val {again.val[equal_steps]:.4f} after {equal_steps} steps"
    )


if __name__ == "__main__":
    main()
