"""The escape time of an induction head: optimiser steps until a fraction (0.9) of fixed
validation samples are answered right, on the Mamba paper's induction-heads task
(minitx/data/induction.py), for one sequence length and one model.

    python scripts/induction_escape.py --length 24 --d-model 128 --heads 8 --out runs/escape.jsonl
    python scripts/induction_escape.py fit runs/escape.jsonl --to 256

The run is the recipe of configs/known_answers/induction.yaml (+ induction_paper.yaml for the
paper's model): 2 layers, GELU MLP, LayerNorm, RoPE, untied embeddings, no dropout, AdamW without
weight decay at a constant rate (2e-4), betas (0.9, 0.999), a fresh batch of 8 every step, only
the last token scored. The model and its optimiser are MinitxLM's own (configure_optimizers);
this loop only leaves out Lightning, whose per-step cost is several times the model's at these
sizes, so that the long plateaus fit a CPU. Each check appends nothing; the run's result is one
JSON line appended to --out: the escape step (or null and the steps run, when it did not escape).

`fit` fits log(steps) = a + b log(length) (one line per model, by least squares; runs that did
not escape are left out and listed), prints b with its 90% interval, and the prediction at --to
with its 90% prediction interval (Student's t on the residuals).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from minitx.data.induction import InductionConfig, induction_sample
from minitx.training.module import MinitxLM

TRAIN_STREAM = 1  # the seed of the training samples' stream (a sample is a pure function of it)
VAL_STREAM = 987654  # the validation samples': apart from the training stream


def batch(task: InductionConfig, stream: int, first: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = np.array([induction_sample(task, stream, first + i).ids for i in range(size)], dtype=np.int64)
    tensor = torch.from_numpy(ids)
    return tensor[:, :-1], tensor[:, -1]


def build(args: argparse.Namespace, length: int) -> MinitxLM:
    torch.manual_seed(args.seed)
    return MinitxLM(
        vocab_size=args.vocab,
        n_layer=2,
        n_head=args.heads,
        d_model=args.d_model,
        block_size=length,
        mlp="gelu",
        norm="layernorm",
        positions=args.positions,
        tie_embeddings=False,
        dropout=0.0,
        attention={"kind": "mha"},
        optimizer="adamw",
        lr=args.lr,
        min_lr=args.lr,
        warmup_steps=0,
        weight_decay=0.0,
        betas=(0.9, args.beta2),
        max_steps=args.max_steps,
    )


def accuracy(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        right = 0
        for start in range(0, len(inputs), 256):
            logits = model(inputs[start : start + 256])[:, -1]
            right += int((logits.argmax(-1) == targets[start : start + 256]).sum())
    model.train()
    return right / len(inputs)


def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    task = InductionConfig(vocab=args.vocab, length=args.length)
    lm = build(args, args.length)
    optimisation = lm.configure_optimizers()
    optimiser, schedule = optimisation["optimizer"], optimisation["lr_scheduler"]["scheduler"]
    model = lm.model.train()
    val_inputs, val_targets = batch(task, VAL_STREAM, 0, args.val_samples)
    started = time.monotonic()
    escaped, history = None, []
    for step in range(1, args.max_steps + 1):
        inputs, targets = batch(task, TRAIN_STREAM + 1000 * args.seed, (step - 1) * args.batch, args.batch)
        loss = F.cross_entropy(model(inputs)[:, -1], targets)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        schedule.step()
        if step % args.check_every == 0:
            acc = accuracy(model, val_inputs, val_targets)
            history.append((step, round(acc, 4)))
            if args.progress:
                print(
                    f"step {step} loss {loss.item():.4f} val {acc:.3f} {time.monotonic() - started:.0f}s",
                    flush=True,
                )
            if acc >= args.threshold:
                escaped = step
                break
    if args.save:
        save_checkpoint(lm, task, args.save)
    result = {
        "length": args.length,
        "d_model": args.d_model,
        "heads": args.heads,
        "positions": args.positions,
        "lr": args.lr,
        "batch": args.batch,
        "betas": [0.9, args.beta2],
        "seed": args.seed,
        "threshold": args.threshold,
        "escape_step": escaped,
        "steps_run": history[-1][0] if history else 0,
        "final_accuracy": history[-1][1] if history else None,
        "wall_s": round(time.monotonic() - started, 1),
        "history": history[-20:],
    }
    print(json.dumps({k: v for k, v in result.items() if k != "history"}), flush=True)
    if args.out:
        with open(args.out, "a") as handle:
            handle.write(json.dumps(result) + "\n")


def save_checkpoint(lm: MinitxLM, task: InductionConfig, path: str) -> None:
    """The trained model as a minitx checkpoint (weights and the "minitx" entry, as train.py writes
    them), so that `train.py --model.init_from PATH` or evaluate.py can start from it."""
    from minitx.files.upgrade import CHECKPOINT_FORMAT

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    checkpoint = {
        "state_dict": {f"model.{name}": tensor for name, tensor in lm.model.state_dict().items()},
        "minitx": {
            "format": CHECKPOINT_FORMAT,
            "model_config": lm.config.to_dict(),
            "tokenizer": task.tokenizer().to_dict(),
            "train_config": None,
        },
    }
    torch.save(checkpoint, path)


def power_fit(lengths: list[float], steps: list[float], to: float) -> dict:
    """log(steps) = a + b log(length) by least squares: b, its 90% interval, and the 90%
    prediction interval of steps at `to`."""
    from scipy import stats

    x, y = np.log(np.asarray(lengths, float)), np.log(np.asarray(steps, float))
    n = len(x)
    X = np.column_stack([np.ones(n), x])
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    dof = n - 2
    out = {"n": n, "exponent": float(coef[1]), "a": float(coef[0])}
    x0 = np.array([1.0, math.log(to)])
    out["predicted"] = float(math.exp(x0 @ coef))
    if dof < 1:
        return out
    residual = y - X @ coef
    s2 = float(residual @ residual) / dof
    cov = s2 * np.linalg.inv(X.T @ X)
    t = float(stats.t.ppf(0.95, dof))
    se_b = math.sqrt(cov[1, 1])
    out["exponent_90"] = [float(coef[1] - t * se_b), float(coef[1] + t * se_b)]
    se_pred = math.sqrt(s2 + float(x0 @ cov @ x0))
    out["predicted_90"] = [float(math.exp(x0 @ coef - t * se_pred)), float(math.exp(x0 @ coef + t * se_pred))]
    out["residual_sd_log"] = math.sqrt(s2)
    return out


def shared_fit(groups: dict[tuple, tuple[list[float], list[float]]], to: float) -> dict:
    """log(steps) = a_model + b log(length): one intercept per model, one exponent for all; b with
    its 90% interval and, per model, the 90% prediction interval of steps at `to`."""
    from scipy import stats

    keys = sorted(groups)
    rows, y = [], []
    for i, key in enumerate(keys):
        lengths, steps = groups[key]
        for length, step in zip(lengths, steps):
            row = [0.0] * len(keys) + [math.log(length)]
            row[i] = 1.0
            rows.append(row)
            y.append(math.log(step))
    X, y = np.asarray(rows), np.asarray(y)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    dof = len(y) - X.shape[1]
    out = {"n": len(y), "exponent": float(coef[-1]), "predicted": {}}
    if dof < 1:
        return out
    residual = y - X @ coef
    s2 = float(residual @ residual) / dof
    cov = s2 * np.linalg.inv(X.T @ X)
    t = float(stats.t.ppf(0.95, dof))
    se_b = math.sqrt(cov[-1, -1])
    out["exponent_90"] = [float(coef[-1] - t * se_b), float(coef[-1] + t * se_b)]
    out["residual_sd_log"] = math.sqrt(s2)
    for i, key in enumerate(keys):
        x0 = np.zeros(X.shape[1])
        x0[i], x0[-1] = 1.0, math.log(to)
        centre = float(x0 @ coef)
        se = math.sqrt(s2 + float(x0 @ cov @ x0))
        out["predicted"][key] = (math.exp(centre), math.exp(centre - t * se), math.exp(centre + t * se))
    return out


def fit(args: argparse.Namespace) -> None:
    rows = [json.loads(line) for line in Path(args.results).read_text().splitlines() if line.strip()]
    models = sorted({(r["d_model"], r["heads"]) for r in rows})
    for d_model, heads in models:
        mine = [r for r in rows if (r["d_model"], r["heads"]) == (d_model, heads)]
        done = [r for r in mine if r["escape_step"]]
        censored = [r for r in mine if not r["escape_step"]]
        print(
            f"width {d_model}, {heads} heads: "
            + ", ".join(
                f"L={r['length']} seed {r['seed']}: {r['escape_step'] or '>' + str(r['steps_run'])}"
                for r in mine
            )
        )
        if len({r["length"] for r in done}) >= 2:
            result = power_fit([r["length"] for r in done], [r["escape_step"] for r in done], args.to)
            print(
                f"  fit over {result['n']} escaped runs: steps ~ L^{result['exponent']:.2f}"
                + (
                    f", 90% interval [{result['exponent_90'][0]:.2f}, {result['exponent_90'][1]:.2f}]"
                    if "exponent_90" in result
                    else ""
                )
                + f"; at L={args.to:g}: {result['predicted']:,.0f} steps"
                + (
                    f", 90% prediction interval [{result['predicted_90'][0]:,.0f}, {result['predicted_90'][1]:,.0f}]"
                    if "predicted_90" in result
                    else ""
                )
            )
        if censored:
            print(f"  not escaped (left out of the fit, lower bounds): {len(censored)}")
    groups = {}
    for r in rows:
        if r["escape_step"]:
            lengths, steps = groups.setdefault((r["d_model"], r["heads"]), ([], []))
            lengths.append(r["length"])
            steps.append(r["escape_step"])
    if len(groups) > 1 and all(len(set(lengths)) >= 2 for lengths, _ in groups.values()):
        shared = shared_fit(groups, args.to)
        line = f"one exponent for every model, over {shared['n']} escaped runs: steps ~ L^{shared['exponent']:.2f}"
        if "exponent_90" in shared:
            low, high = shared["exponent_90"]
            line += f", 90% interval [{low:.2f}, {high:.2f}]"
        print(line)
        for (d_model, heads), (centre, low, high) in shared["predicted"].items():
            print(
                f"  width {d_model}, {heads} heads at L={args.to:g}: {centre:,.0f} steps, 90% prediction interval [{low:,.0f}, {high:,.0f}]"
            )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "fit":
        parser = argparse.ArgumentParser(prog="induction_escape.py fit")
        parser.add_argument("results", help="the JSON lines the runs appended (--out)")
        parser.add_argument("--to", type=float, default=256, help="the length to extrapolate to")
        args = parser.parse_args(argv[1:])
        if not Path(args.results).is_file():
            print(f"induction_escape.py: results: no such file {args.results}", file=sys.stderr)
            return 2
        fit(args)
        return 0
    parser = argparse.ArgumentParser(prog="induction_escape.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, required=True, help="input tokens of a sample")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--positions", choices=("rope", "learned"), default="rope")
    parser.add_argument("--vocab", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--beta2", type=float, default=0.999)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument(
        "--seed", type=int, default=1, help="the model's initialisation and the training stream"
    )
    parser.add_argument("--max-steps", type=int, default=200000)
    parser.add_argument("--check-every", type=int, default=100)
    parser.add_argument("--val-samples", type=int, default=512)
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--out", help="append the result as one JSON line to this file")
    parser.add_argument("--progress", action="store_true", help="print every check")
    parser.add_argument("--save", help="write the trained model as a minitx checkpoint to this path")
    args = parser.parse_args(argv)
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
