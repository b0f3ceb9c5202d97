"""Past the trained length, evaluate.py splits a recall task's accuracy two ways: by the distance
from each answer's value back to its query (near: within the longest a trained sample holds; far:
beyond) and by the value's position (early: a position trained samples hold; late: past them).
Checked with models whose reach is known (right exactly when the value is near enough, or early
enough) and against a plain per-sample count on a real model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from minitx.config import ModelConfig
from minitx.data.induction import InductionConfig
from minitx.data.toy import IGNORE_INDEX, toy_batch
from minitx.evaluation.progress import Progress
from minitx.evaluation.report import _length_rows
from minitx.evaluation.tasks import TrainedSpan, figures, score_samples, task_by_length
from minitx.model import Transformer


class ReachOracle(nn.Module):
    """Answers the induction query right when the trigger's letter lies at most `reach` tokens
    before it (with `by_position`: at a position up to `reach`), and gives the next letter over
    (wrong) otherwise."""

    def __init__(self, vocab: int, reach: int, by_position: bool = False):
        super().__init__()
        self.config = ModelConfig(vocab_size=vocab, block_size=4096, n_layer=1, n_head=1, d_model=8)
        self.vocab, self.reach, self.by_position = vocab, reach, by_position
        self.anchor = nn.Parameter(torch.zeros(1))  # score_samples reads the device off a parameter

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def forward_embeddings(self, x: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*x.shape, self.vocab)
        for row, ids in enumerate(x.tolist()):
            query = len(ids) - 1  # the trigger asked again (toy_batch pads nothing: one length)
            value = ids.index(0) + 1  # the letter after the first trigger
            known = (value if self.by_position else query - value) <= self.reach
            letter = ids[value] if known else 1 + ids[value] % (self.vocab - 1)
            logits[row, query, letter] = 1.0
        return logits


def _distances(samples) -> list[int]:
    return [len(s.ids) - 2 - (s.trigger_at + 1) for s in samples]


def _values(samples) -> list[int]:
    return [s.trigger_at + 1 for s in samples]


TRAINED = InductionConfig(vocab=8, length=12)
SPAN = TrainedSpan(TRAINED.longest_distance(), TRAINED.latest_value())


def test_the_span_is_what_trained_samples_hold():
    samples = [TRAINED.sample(1, i) for i in range(2000)]
    assert SPAN == TrainedSpan(10, 10)  # the trigger at 0 or 9, its letter at 1 or 10, the query at 11
    assert max(_distances(samples)) == SPAN.distance and max(_values(samples)) == SPAN.position


@pytest.mark.parametrize("by_position", [False, True])
def test_the_split_puts_each_answer_on_its_sides_of_the_span(by_position):
    longer = TRAINED.at_length(40)
    samples = [longer.sample(3, i) for i in range(300)]
    near = sum(d <= SPAN.distance for d in _distances(samples))
    early = sum(v <= SPAN.position for v in _values(samples))
    assert 0 < near < len(samples) and 0 < early < len(samples)  # every side holds answers
    oracle = ReachOracle(8, 10, by_position)
    totals = figures(score_samples(oracle, samples, longer.pad_id, span=SPAN))
    assert (totals["near_items"], totals["far_items"]) == (near, len(samples) - near)
    assert (totals["early_items"], totals["late_items"]) == (early, len(samples) - early)
    right, wrong = ("early", "late") if by_position else ("near", "far")
    assert totals[f"{right}_accuracy"] == 1.0 and totals[f"{wrong}_accuracy"] == 0.0
    assert totals["item_accuracy"] == (early if by_position else near) / len(samples)
    # An oracle one token shorter misses exactly the answers at the span's edge.
    edge = sum(x == 10 for x in (_values(samples) if by_position else _distances(samples)))
    short = figures(score_samples(ReachOracle(8, 9, by_position), samples, longer.pad_id, span=SPAN))
    assert short[f"{right}_accuracy"] == 1 - edge / totals[f"{right}_items"]


def test_by_length_splits_past_the_trained_length_only():
    by_length = task_by_length(ReachOracle(8, 10), TRAINED, 5, 0, [12, 48], 200, Progress(False))
    assert "near_items" not in by_length["12"] and by_length["12"]["accuracy"] == 1.0
    assert by_length["48"]["near_accuracy"] == 1.0 and by_length["48"]["far_accuracy"] == 0.0
    assert by_length["48"]["near_items"] + by_length["48"]["far_items"] == 200
    assert by_length["48"]["early_items"] + by_length["48"]["late_items"] == 200
    rows = _length_rows(by_length, "accuracy")
    assert rows[0].split()[-4:] == ["near", "far", "early", "late"]
    assert f"1.0000 ({by_length['48']['near_items']})" in rows[2] and "0.0000 (" in rows[2]


def test_the_split_matches_a_plain_count_on_a_real_model():
    torch.manual_seed(0)
    model = Transformer(
        ModelConfig(vocab_size=8, block_size=64, n_layer=1, n_head=2, d_model=16, positions="rope")
    ).eval()
    task = InductionConfig(vocab=8, length=48)
    samples = [task.sample(11, i) for i in range(64)]
    x, y = toy_batch(samples, None, task.pad_id)
    with torch.no_grad():
        right = (model(x).argmax(-1) == y)[y != IGNORE_INDEX].tolist()
    totals = score_samples(model, samples, task.pad_id, span=TrainedSpan(20, 30))
    for sides, inside in (
        (("near", "far"), [d <= 20 for d in _distances(samples)]),
        (
            ("early", "late"),
            [v <= 30 for v in _values(samples)],
        ),
    ):
        assert totals[f"{sides[0]}_items"] == sum(inside) and totals[f"{sides[1]}_items"] == len(
            inside
        ) - sum(inside)
        assert totals[f"{sides[0]}_correct"] == sum(r for r, n in zip(right, inside) if n)
        assert totals[f"{sides[1]}_correct"] == sum(r for r, n in zip(right, inside) if not n)
