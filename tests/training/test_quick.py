"""minitx.training.quick: the plain loop the slow tests and the reduced diagnostics train with."""

from __future__ import annotations

import torch

from minitx.data.zoology import ZoologyConfig
from minitx.model import Transformer
from minitx.training.quick import train_on_task, zoology_reduced_model


def test_reports_at_the_start_every_n_steps_and_at_the_end_in_eval_mode():
    task = ZoologyConfig(vocab=32, pairs=2, seq_len=16)
    torch.manual_seed(0)
    model = Transformer(zoology_reduced_model("mha", 16, vocab=32))
    seen = []
    before = [p.detach().clone() for p in model.parameters()]
    trained = train_on_task(
        model,
        task,
        steps=5,
        batch=4,
        lr=1e-3,
        every=2,
        report=lambda step, m: seen.append((step, m.training)),
    )
    assert seen == [(0, False), (2, False), (4, False), (5, False)]
    assert trained is model and not model.training
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))  # it trained


def test_the_same_seed_trains_the_same_model():
    task = ZoologyConfig(vocab=32, pairs=2, seq_len=16)

    def run(seed: int) -> list[torch.Tensor]:
        torch.manual_seed(seed)
        model = train_on_task(Transformer(zoology_reduced_model("gdn", 16, vocab=32)), task, 3, 4, 1e-3, seed)
        return [p.detach() for p in model.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(run(1), run(1)))
    assert not all(torch.equal(a, b) for a, b in zip(run(1), run(2)))
