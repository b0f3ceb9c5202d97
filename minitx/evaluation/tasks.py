"""Accuracy on a synthetic task (toy, mqar, needle, zoology, induction, markov) on a fresh,
seeded test set; for a recall task (zoology, induction) also the recall circuit's two weights,
and for induction past its trained length the accuracy split by where the letter to copy lies
(TrainedSpan: near or far from the query, at a trained position or past them).

The test samples are those after the run's training and validation samples in its own stream
(data.seed), or in the stream data.seed + seed for another seed: never samples it trained on.
Scores are on the answers only: loss per answer token, per-item accuracy (answer tokens whose
argmax is right) and exact match (samples whose every answer token is right: equal to greedy
decoding's exact match, see minitx.data.toy.exact_match).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..attention.gdn import GatedDeltaNet
from ..data.config import DataConfig
from ..data.needle import DEPTHS, SHORTEST, needle_sample
from ..data.task import Task
from ..data.toy import IGNORE_INDEX, exact_match, toy_batch
from ..errors import UserError
from .lengths import length_refusal
from .perplexity import batch_tokens
from .progress import Progress
from .recall_circuit import recall_circuit

SAMPLES = 512  # test samples of the toy and MQAR tasks
NEEDLE_SAMPLES = 20  # test samples per (depth, length) cell of the needle task
CIRCUIT_SAMPLES = 64  # the first test samples whose attention maps give the recall circuit


@dataclass(frozen=True)
class TrainedSpan:
    """What a recall task's trained samples hold: its answers' values lie at most `distance`
    tokens before their queries, at positions up to `position`. Past the trained length an answer
    can lie beyond either; RoPE reads distances, learned positions read positions."""

    distance: int
    position: int

    def sides(self, value: int, query: int) -> tuple[str, str]:
        return (
            "near" if query - value <= self.distance else "far",
            "early" if value <= self.position else "late",
        )


SIDES = ("near", "far", "early", "late")


@torch.inference_mode()
def score_samples(
    model, samples: list, pad_id: int, progress: Progress | None = None, span: TrainedSpan | None = None
) -> dict:
    """Summed answer loss, answer tokens, right answer tokens and exactly right samples. With
    `span` (a recall task's samples), also the answers (`<side>_items`, `<side>_correct`) whose
    value lies within span.distance of its query (near) or further (far), and at a position up
    to span.position (early) or past it (late)."""
    device = next(model.parameters()).device
    per_batch = max(1, batch_tokens(model.config.vocab_size) // max(len(s.ids) for s in samples))
    totals = {"nats": 0.0, "items": 0, "correct": 0, "exact": 0.0, "samples": 0}
    if span is not None:
        totals.update({f"{side}_{what}": 0 for side in SIDES for what in ("items", "correct")})
    for start in range(0, len(samples), per_batch):
        batch = samples[start : start + per_batch]
        x, y = toy_batch(batch, None, pad_id)
        x, y = x.to(device), y.to(device)
        logits = model.forward_embeddings(model.embed(x)).float()  # any length a RoPE model can run
        target = y != IGNORE_INDEX
        totals["nats"] += float(
            F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
        )
        totals["items"] += int(target.sum())
        right = (logits.argmax(-1) == y) & target
        totals["correct"] += int(right.sum())
        if span is not None:
            _tally_by_span(totals, right.cpu(), batch, span)
        rows = int(target.any(-1).sum())
        totals["exact"] += float(exact_match(logits, y)) * rows
        totals["samples"] += rows
        if progress is not None:
            progress(min(start + per_batch, len(samples)), len(samples))
    return totals


def _tally_by_span(totals: dict, right: torch.Tensor, batch: list, span: TrainedSpan) -> None:
    """Count each answer on its sides of `span`. A query's logits are scored at its own input
    position (the answer is the next token)."""
    for row, sample in enumerate(batch):
        _, values, queries = sample.recall_positions()
        for value, query in zip(values, queries):
            for side in span.sides(value, query):
                totals[f"{side}_items"] += 1
                totals[f"{side}_correct"] += int(right[row, query])


def figures(totals: dict) -> dict:
    loss = totals["nats"] / totals["items"]
    result = {
        "loss": loss,
        "exact_match": totals["exact"] / totals["samples"],
        "item_accuracy": totals["correct"] / totals["items"],
        "samples": totals["samples"],
        "items": totals["items"],
    }
    for side in SIDES:
        if f"{side}_items" in totals:
            items = totals[f"{side}_items"]
            result[f"{side}_items"] = items
            result[f"{side}_accuracy"] = totals[f"{side}_correct"] / items if items else None
    return result


def _add(totals: dict, more: dict) -> dict:
    return {key: totals.get(key, 0) + value for key, value in more.items()}


def needle_grid(
    model, task, stream: int, start: int, lengths: list[int], per_cell: int, progress: Progress
) -> tuple[dict, dict, dict]:
    """(totals over every cell, accuracy heatmap depth x length, figures by length)."""
    accuracy = [[None] * len(lengths) for _ in DEPTHS]
    heatmap = {"depths": list(DEPTHS), "lengths": list(lengths), "accuracy": accuracy}
    by_length: dict[str, dict] = {}
    totals: dict = {}
    for column, length in enumerate(lengths):
        reason = length_refusal(model.config, length)
        if reason is None and length < SHORTEST:
            reason = f"a needle sample needs at least {SHORTEST} tokens"
        if reason is not None:
            by_length[str(length)] = {"skipped": reason}
            continue
        at_length: dict = {}
        for row, depth in enumerate(DEPTHS):
            first = start + (column * len(DEPTHS) + row) * per_cell
            samples = [needle_sample(task, stream, first + i, length, depth, "test") for i in range(per_cell)]
            cell = score_samples(
                model, samples, task.pad_id, progress.stage(f"needle, length {length}, depth {depth:.0%}")
            )
            accuracy[row][column] = cell["exact"] / cell["samples"]
            at_length = _add(at_length, cell)
        by_length[str(length)] = {
            **figures(at_length),
            "accuracy": at_length["exact"] / at_length["samples"],
            "tokens": at_length["items"],
        }
        totals = _add(totals, at_length)
    if not totals:
        raise UserError(
            f"--lengths: no length the model can run holds a needle sample (at least {SHORTEST} tokens); give longer --lengths"
        )
    return totals, heatmap, by_length


def task_by_length(
    model, task: Task, stream: int, start: int, lengths: list[int], samples: int | None, progress: Progress
) -> dict:
    """Figures of the task at each of `lengths` input tokens (task.at_length), on fresh samples;
    a length the model cannot run (learned positions past block_size) is given with its reason.
    Past the trained length the accuracy is also split two ways (TrainedSpan): by the answer's
    distance back from its query (within the longest a trained sample holds, or beyond) and by
    its position (within the trained positions, or past them). A model that copies by content
    answers every side alike; RoPE's failures lie beyond the distance, learned positions' past
    the positions."""
    by_length: dict[str, dict] = {}
    for length in lengths:
        reason = length_refusal(model.config, length)
        if reason is not None:
            by_length[str(length)] = {"skipped": reason}
            continue
        at = task.at_length(length)
        test_set = [at.sample(stream, start + i) for i in range(samples or SAMPLES)]
        span = TrainedSpan(*task.trained_span()) if length > task.max_length() - 1 else None
        scored = figures(
            score_samples(model, test_set, at.pad_id, progress.stage(f"length {length}"), span=span)
        )
        by_length[str(length)] = {**scored, "accuracy": scored["item_accuracy"], "tokens": scored["items"]}
    return by_length


def task_recall_circuit(model, samples: list, pad_id: int) -> dict:
    """The recall circuit's two weights on `samples` (minitx/evaluation/recall_circuit.py), or why
    there are none: a kind without a materialised map (a user's kind may have none), or a gdn
    layer where the circuit's heads would be, whose map is a linear recurrence's (signed and
    unnormalised: its weights are no attention a previous-token head could be read from)."""
    if any(isinstance(block.attn, GatedDeltaNet) for block in (model.blocks[0], model.blocks[-1])):
        return {"skipped": "a gdn layer forms no softmax map; the circuit is attention's"}
    x, _ = toy_batch(samples, None, pad_id)
    try:
        with torch.no_grad():
            maps = model.attention_maps(x.to(next(model.parameters()).device))
    except NotImplementedError as why:
        return {"skipped": str(why)}
    return {**recall_circuit(maps, samples).to_dict(), "samples": len(samples)}


def evaluate_task(
    model, data: dict, tokenizer, lengths: list[int], samples: int | None, seed: int, progress: Progress
) -> dict:
    """The figures of a checkpoint trained on data.source in TASKS, on a fresh test set."""
    source = data["source"]
    task = DataConfig.from_config(data).synthetic_task()
    if task.tokenizer().fingerprint() != tokenizer.fingerprint():
        raise UserError(
            f"--ckpt: its tokenizer is not the {source} task's; the file is damaged or from another version"
        )
    if samples is not None and samples < 1:
        raise UserError(f"--task-samples: is {samples}; use 1 or more")
    stream = int(data.get("seed", 1337)) + seed
    # past training and validation
    start = int(data.get("toy_train_size", 100_000)) + int(data.get("toy_val_size", 512))
    result: dict = {
        "task": {"name": source, "seed": seed, "stream": stream, "first_sample": start},
        "by_length": {},
    }
    if task.depth_grid:
        totals, heatmap, result["by_length"] = needle_grid(
            model, task, stream, start, lengths, samples or NEEDLE_SAMPLES, progress
        )
        result["task"]["heatmap"] = heatmap
    else:
        if task.max_length() - 1 > model.config.block_size and model.config.positions == "learned":
            raise UserError(f"--ckpt: the {source} task's samples are longer than the model's block_size")
        test_set = [task.sample(stream, start + i) for i in range(samples or SAMPLES)]
        totals = score_samples(model, test_set, task.pad_id, progress.stage(f"{source} test set"))
        # The task's evaluation hooks (minitx/data/task.py's Task): each None or False where the
        # task offers none.
        reference = task.reference_losses(test_set)  # what known strategies lose here (markov)
        if reference is not None:
            result["task"]["reference_losses"] = reference
        if task.sweeps_lengths:  # the same task at other lengths (induction): --lengths
            result["by_length"] = task_by_length(model, task, stream, start, lengths, samples, progress)
        if task.recalls:  # a recall task (zoology, induction): its samples' recall_positions
            result["task"]["recall_circuit"] = task_recall_circuit(
                model, test_set[:CIRCUIT_SAMPLES], task.pad_id
            )
    result["task"].update(figures(totals))
    loss = result["task"]["loss"]
    result.update(
        loss=loss,
        perplexity=math.exp(loss),
        # a character tokenizer: an answer token is a character
        bits_per_char=totals["nats"] / math.log(2) / totals["items"],
        bits_per_byte=None,
        tokens=totals["items"],
        unit="character",
        text=f"a fresh test set of the {source} task",
        by_position=None,
    )
    return result
