"""Past the trained length, evaluate.py splits a recall task's accuracy by distance: answers whose
value lies within the longest distance a trained sample holds, and beyond it. Checked with a
model whose reach is known (it answers right exactly when the value is near enough) and against a
plain per-sample count on a real model."""

from __future__ import annotations

import torch
from torch import nn

from minitx.config import ModelConfig
from minitx.data.induction import InductionConfig
from minitx.data.toy import IGNORE_INDEX, toy_batch
from minitx.evaluation.progress import Progress
from minitx.evaluation.report import _length_rows
from minitx.evaluation.tasks import figures, score_samples, task_by_length
from minitx.model import Transformer


class ReachOracle(nn.Module):
    """Answers the induction query right when the trigger's letter lies at most `reach` tokens
    before it, and gives the next letter over (wrong) when it lies further."""

    def __init__(self, vocab: int, reach: int):
        super().__init__()
        self.config = ModelConfig(vocab_size=vocab, block_size=4096, n_layer=1, n_head=1, d_model=8)
        self.vocab, self.reach = vocab, reach
        self.anchor = nn.Parameter(torch.zeros(1))  # score_samples reads the device off a parameter

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def forward_embeddings(self, x: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*x.shape, self.vocab)
        for row, ids in enumerate(x.tolist()):
            query = len(ids) - 1  # the trigger asked again (toy_batch pads nothing: one length)
            value = ids.index(0) + 1  # the letter after the first trigger
            letter = ids[value] if query - value <= self.reach else 1 + ids[value] % (self.vocab - 1)
            logits[row, query, letter] = 1.0
        return logits


def _distances(samples) -> list[int]:
    return [len(s.ids) - 2 - (s.trigger_at + 1) for s in samples]


def test_the_split_puts_each_answer_on_its_side_of_the_reach():
    trained = InductionConfig(vocab=8, length=12)
    reach = trained.longest_distance()
    assert reach == 10  # the trigger at 0, its letter at 1, the query at 11
    assert max(_distances([trained.sample(1, i) for i in range(2000)])) == reach  # and no further
    longer = trained.at_length(40)
    samples = [longer.sample(3, i) for i in range(300)]
    near = sum(d <= reach for d in _distances(samples))
    assert 0 < near < len(samples)  # both sides hold answers
    totals = figures(score_samples(ReachOracle(8, reach), samples, longer.pad_id, reach=reach))
    assert (totals["near_items"], totals["far_items"]) == (near, len(samples) - near)
    assert totals["near_accuracy"] == 1.0 and totals["far_accuracy"] == 0.0
    assert totals["item_accuracy"] == near / len(samples)
    # An oracle one token shorter misses exactly the answers at the reach itself.
    at_reach = sum(d == reach for d in _distances(samples))
    short = figures(score_samples(ReachOracle(8, reach - 1), samples, longer.pad_id, reach=reach))
    assert short["near_accuracy"] == (near - at_reach) / near


def test_by_length_splits_past_the_trained_length_only():
    trained = InductionConfig(vocab=8, length=12)
    by_length = task_by_length(ReachOracle(8, 10), trained, 5, 0, [12, 48], 200, Progress(False))
    assert "near_items" not in by_length["12"] and by_length["12"]["accuracy"] == 1.0
    assert by_length["48"]["near_accuracy"] == 1.0 and by_length["48"]["far_accuracy"] == 0.0
    assert by_length["48"]["near_items"] + by_length["48"]["far_items"] == 200
    rows = _length_rows(by_length, "accuracy")
    assert "within trained distance" in rows[0]
    assert f"1.0000 (of {by_length['48']['near_items']})" in rows[2] and "0.0000 (of" in rows[2]


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
    near = [d <= 20 for d in _distances(samples)]
    totals = score_samples(model, samples, task.pad_id, reach=20)
    assert totals["near_items"] == sum(near) and totals["far_items"] == len(near) - sum(near)
    assert totals["near_correct"] == sum(r for r, n in zip(right, near) if n)
    assert totals["far_correct"] == sum(r for r, n in zip(right, near) if not n)
