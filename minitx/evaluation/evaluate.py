"""evaluate_checkpoint: every figure of one checkpoint, as a JSON-able dict.

    {"loss", "perplexity", "bits_per_char", "bits_per_byte", "tokens", "unit", "context", "stride",
     "by_position": {...}, "by_length": {"<L>": {"loss", "tokens", "by_position"} or {"skipped": why}},
     "task": None or {"exact_match", "item_accuracy", ...},
     "diagnostics": {...} with diagnostics=True (see diagnostics.run_diagnostics), ...}

Every check of the input happens before the first forward pass; a mistake is a UserError.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from ..errors import UserError
from ..generation.command import usable_device
from ..trained_model import load_checkpoint
from .diagnostics import held_out_sequences, run_diagnostics
from .lengths import default_lengths, length_refusal, length_sweep, position_buckets
from .perplexity import batch_tokens, score_tokens
from .progress import Progress
from .tasks import evaluate_task
from .texts import TASK_SOURCES, ScoredText, files_text, tokenize, truncate, validation_text

SWEEP_TOKENS = 32768  # targets per length of the sweep by default: 1/16 of the default run's validation text
# The diagnostics' held-out sequences: Gu et al.'s 100 of 64 tokens (fewer tokens past block_size).
DIAGNOSTIC_SEQUENCES, DIAGNOSTIC_LENGTH = 100, 64


def check_lengths(config, asked: Sequence[tuple[str, int]]) -> None:
    """UserError for a context length (named by its flag) that the model cannot run."""
    for flag, length in asked:
        if length < 1:
            raise UserError(f"{flag}: {length} is not a context length; use 1 or more")
        reason = length_refusal(config, length)
        if reason is not None:
            raise UserError(
                f"{flag}: {length} is past what this model can run ({reason}); use at most {config.block_size}"
            )


def check_window(config, targets: int, context: int, stride: int) -> None:
    """UserError for a context or stride the model or the text cannot take (named as the flags)."""
    if context < 1:
        raise UserError(f"--context: is {context}; use 1 or more (default: block_size={config.block_size})")
    if not 1 <= stride <= context:
        raise UserError(
            f"--stride: is {stride}; use 1 .. --context ({context}): each window must score at least one new token and skip none"
        )
    check_lengths(config, [("--context", context)])
    if context > targets:
        raise UserError(
            f"--context: the text has {targets} tokens to score, fewer than one window of {context}; "
            "lower --context or give a longer text"
        )


def text_figures(nats: float, tokens: int, characters: int, size: int) -> dict:
    """Loss, perplexity and bits per character and per byte from summed nats."""
    loss = nats / tokens
    bits = nats / math.log(2)
    return {
        "loss": loss,
        "perplexity": math.exp(min(loss, 700.0)),
        "bits_per_char": bits / characters,
        "bits_per_byte": bits / size,
        "tokens": tokens,
    }


def evaluate_text(
    model,
    text: ScoredText,
    context: int,
    stride: int,
    lengths: list[int],
    batch_tokens: int,
    progress: Progress,
    sweep_tokens: int | None = SWEEP_TOKENS,
) -> dict:
    """The whole-text figures at `context`, then the length sweep on the text's first
    `sweep_tokens` targets (None or 0: all of them)."""
    stage = progress.stage(f"loss at context {context}")
    scores = score_tokens(model, text.tokens, context, stride, max(1, batch_tokens // context), stage)
    result = text_figures(scores.nats, scores.tokens, text.characters, text.bytes)
    result.update(text=text.name, unit=text.unit, characters=text.characters, bytes=text.bytes)
    result.update(context=context, stride=stride, by_position=position_buckets(scores))
    swept = text.tokens[: sweep_tokens + 1] if sweep_tokens else text.tokens
    result["sweep_tokens"] = len(swept) - 1
    reuse = stride == context and len(swept) == len(text.tokens)  # the whole-text figure is that length's
    asked = [n for n in lengths if not (reuse and n == context)]
    by_length = length_sweep(model, swept, asked, batch_tokens, progress.stage("length sweep"))
    if reuse and context in lengths:
        by_length[str(context)] = {
            "loss": scores.loss,
            "tokens": scores.tokens,
            "by_position": result["by_position"],
        }
    result["by_length"] = {str(length): by_length[str(length)] for length in lengths}
    return result


def evaluate_checkpoint(
    ckpt_path: str,
    lengths: Sequence[int] | None = None,
    max_tokens: int | None = None,
    files: str | Sequence[str] | None = None,
    context: int | None = None,
    stride: int | None = None,
    batch_size: int | None = None,
    device: str = "cpu",
    task_samples: int | None = None,
    seed: int = 0,
    progress: bool | None = False,
    refuse_lengths: bool = False,
    sweep_tokens: int | None = SWEEP_TOKENS,
    trust_kind_modules: bool | Sequence[str] = False,
    diagnostics: bool = False,
) -> dict:
    """Evaluate a checkpoint saved by train.py.

    The text is the run's own validation text (rebuilt from the data settings the checkpoint
    carries), or `files`. A checkpoint trained on a synthetic task (toy, mqar, needle) is scored
    on a fresh test set of that task instead, unless `files` is given. `lengths` (default
    block_size/4 .. 8 x block_size) are scored on the text's first `sweep_tokens` targets (None
    or 0: all), skipped with a reason where the model cannot run them, or refused (UserError)
    with `refuse_lengths`. `max_tokens` scores only the text's first max_tokens + 1 tokens.
    `batch_size`: windows per forward pass at `context` (the sweep keeps the same tokens per
    pass). `progress`: True, False, or None (on a terminal only). `trust_kind_modules`: whether
    the checkpoint may import the modules of its attention kinds (minitx.trained_model.load_checkpoint).
    `diagnostics`: also result["diagnostics"], run_diagnostics (minitx/evaluation/diagnostics.py) on
    100 sequences of min(64, block_size) tokens spread over the scored text.
    """
    started = time.monotonic()
    model, tokenizer, raw = load_checkpoint(
        ckpt_path, map_location=usable_device(device), label="--ckpt", trust_kind_modules=trust_kind_modules
    )
    config = model.config
    lengths = sorted(set(default_lengths(config.block_size) if lengths is None else lengths))
    context = config.block_size if context is None else context
    stride = context if stride is None else stride
    if max_tokens is not None and max_tokens < 1:
        raise UserError(f"--max-tokens: is {max_tokens}; use 1 or more, or leave it unset for the whole text")
    if sweep_tokens is not None and sweep_tokens < 0:
        raise UserError(f"--sweep-tokens: is {sweep_tokens}; use 1 or more, or 0 for the whole text")
    if batch_size is not None and batch_size < 1:
        raise UserError(f"--batch-size: is {batch_size}; use 1 or more")
    check_lengths(config, [("--lengths", length) for length in lengths] if refuse_lengths else [])
    train_config = raw["minitx"].get("train_config") or {}
    source = (train_config.get("data") or {}).get("source")
    if diagnostics and files is None and source in TASK_SOURCES:
        raise UserError(
            f"--diagnostics: the run trained on the synthetic task {source!r}, which has no held-out text; give --files"
        )
    bar = Progress(progress)
    try:
        if files is None and source in TASK_SOURCES:
            result = evaluate_task(model, train_config["data"], tokenizer, lengths, task_samples, seed, bar)
        else:
            if files is not None:
                name, text = files_text(files)
                scored = truncate(tokenize(name, text, tokenizer, "--files"), max_tokens, tokenizer)
            else:
                scored = truncate(validation_text(train_config, tokenizer), max_tokens, tokenizer)
            check_window(config, len(scored.tokens) - 1, context, stride)
            if diagnostics:  # cut before the first forward pass: a text too short is refused first
                seq_len = min(DIAGNOSTIC_LENGTH, config.block_size)
                held_out = held_out_sequences(scored.tokens, DIAGNOSTIC_SEQUENCES, seq_len)
            per_pass = batch_size * context if batch_size else batch_tokens(config.vocab_size)
            result = evaluate_text(model, scored, context, stride, lengths, per_pass, bar, sweep_tokens)
            result["task"] = None
            if diagnostics:
                result["diagnostics"] = run_diagnostics(model, held_out)
    finally:
        bar.close()
    shape = dict(positions=config.positions, block_size=config.block_size, layers=list(config.layer_kinds))
    result.update(checkpoint=str(ckpt_path), model=shape, seconds=time.monotonic() - started)
    return result
