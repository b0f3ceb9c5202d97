"""The `evaluate.py` / `minitx-eval` command: parse the flags, evaluate, print, write."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from ..arguments import ArgumentParser, add_trust_argument
from ..errors import UserError
from ..files.atomic import write_json_atomically
from ..generation.command import usable_device
from ..wording import counted
from .attention_maps import DEFAULT_PROMPT, check_maps_path, draw_attention_maps
from .evaluate import SWEEP_TOKENS, evaluate_checkpoint
from .report import table, write_plots

# The flags evaluate_checkpoint takes as given: its keywords of the same names.
AS_GIVEN = (
    "lengths max_tokens files context stride batch_size device task_samples seed sweep_tokens "
    "trust_kind_modules diagnostics"
).split()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = ArgumentParser(
        prog="evaluate.py",
        description="Evaluate a checkpoint saved by train.py: held-out loss, "
        "perplexity and bits per character over a whole text, loss by context length and by "
        "position, and accuracy on a synthetic task.",
    )
    parser.add_argument("--ckpt", required=True, help="checkpoint file (.ckpt) saved by train.py")
    parser.add_argument(
        "--files", nargs="+", help="score these text files (globs) instead of the run's validation text"
    )
    parser.add_argument("--context", type=int, help="tokens per window (default: the model's block_size)")
    parser.add_argument(
        "--stride", type=int, help="tokens between window starts, 1 .. context (default: context)"
    )
    parser.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        help="context lengths of the extrapolation table (default: block_size/4 .. 8 x block_size)",
    )
    parser.add_argument("--max-tokens", type=int, help="score only the first N tokens of the text")
    parser.add_argument(
        "--sweep-tokens",
        type=int,
        default=SWEEP_TOKENS,
        help=f"tokens of the text (its first) that each length of the sweep scores; 0: all (default {SWEEP_TOKENS})",
    )
    parser.add_argument(
        "--task-samples", type=int, help="test samples of a synthetic task (default: the task's)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of a synthetic task's fresh test set (default 0)"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        help="windows per forward pass (default: 8192 tokens' worth, fewer for a large vocabulary)",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps, ... (default cpu)")
    parser.add_argument(
        "--diagnostics",
        action="store_true",
        help="also attention sinks, massive activations, attention entropy and loss by position "
        "on 100 held-out sequences of 64 tokens (docs/evaluation.md)",
    )
    parser.add_argument("--json", help="also write every figure to this JSON file")
    parser.add_argument("--plots", help="write PNG plots into this directory")
    parser.add_argument("--no-progress", action="store_true", help="never show the progress line")
    parser.add_argument(
        "--lm-eval-tasks",
        help="comma-separated lm-evaluation-harness tasks (e.g. "
        "hellaswag,lambada_openai) instead of the text evaluation; needs the eval extra and the network",
    )
    parser.add_argument(
        "--lm-eval-limit", type=int, help="score only the first N examples of each lm-eval task"
    )
    parser.add_argument("--lm-eval-include", help="a directory of your own lm-eval task YAML files")
    parser.add_argument(
        "--attention-maps",
        metavar="FILE.png",
        help="instead of the text evaluation, draw every layer's and head's attention over "
        "--attention-prompt into this PNG, through each kind's materialised attention",
    )
    parser.add_argument(
        "--attention-prompt",
        default=DEFAULT_PROMPT,
        help="the text whose attention --attention-maps draws (at most block_size tokens; default: %(default)r)",
    )
    add_trust_argument(parser)
    return parser.parse_args(argv)


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse outputs that cannot be written before any work is done."""
    if args.json is not None:
        target = Path(args.json)
        if target.is_dir():
            raise UserError(f"--json {args.json}: is a directory; give a file name such as out.json")
        if not target.parent.is_dir():
            raise UserError(
                f"--json {args.json}: directory {str(target.parent)!r} does not exist; create it first"
            )
        if not os.access(target.parent, os.W_OK):
            raise UserError(f"--json {args.json}: directory {str(target.parent)!r} is not writable")
    if args.plots is not None and Path(args.plots).exists() and not Path(args.plots).is_dir():
        raise UserError(f"--plots {args.plots}: exists and is not a directory; give a directory")


def attention_maps(args: argparse.Namespace) -> dict:
    if args.lm_eval_tasks or args.diagnostics:
        flag = "--lm-eval-tasks" if args.lm_eval_tasks else "--diagnostics"
        raise UserError(f"--attention-maps: not with {flag}; run the two separately")
    check_maps_path(args.attention_maps)
    from ..trained_model import load_checkpoint

    model, tokenizer, _ = load_checkpoint(
        args.ckpt,
        map_location=usable_device(args.device),
        label="--ckpt",
        trust_kind_modules=args.trust_kind_modules,
    )
    drawn = draw_attention_maps(model, tokenizer, args.attention_prompt, args.attention_maps)
    if drawn["cut"]:
        block = model.config.block_size
        print(
            f"--attention-prompt: {drawn['tokens'] + drawn['cut']} tokens, longer than block_size={block}: "
            f"its first {drawn['cut']} left out, the last {block} drawn"
        )
    print(
        f"wrote {args.attention_maps}: {counted(drawn['layers'], 'layer')} ({', '.join(drawn['kinds'])}) x "
        f"{counted(drawn['heads'], 'head')} over {counted(drawn['tokens'], 'token')}"
    )
    return drawn


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    check_outputs(args)
    if args.lm_eval_tasks and args.diagnostics:
        raise UserError("--diagnostics: not with --lm-eval-tasks; run the two evaluations separately")
    if args.attention_maps is not None:
        return attention_maps(args)
    if args.lm_eval_tasks:
        tasks = [task.strip() for task in args.lm_eval_tasks.split(",") if task.strip()]
        # lm-eval is optional: imported when asked for
        from ..hf.lm_eval_adapter import evaluate_tasks, results_table

        results = evaluate_tasks(
            args.ckpt,
            tasks,
            args.device,
            args.lm_eval_limit,
            args.lm_eval_include,
            trust_kind_modules=args.trust_kind_modules,
        )
        print(results_table(results))
        return results
    result = evaluate_checkpoint(
        args.ckpt,
        progress=False if args.no_progress else None,
        refuse_lengths=args.lengths is not None,
        **{name: getattr(args, name) for name in AS_GIVEN},
    )
    print(table(result))
    if args.json is not None:
        write_json_atomically(args.json, result)
        print(f"wrote {args.json}")
    if args.plots is not None:
        for path in write_plots(args.plots, result):
            print(f"wrote {path}")
    return result
