"""What a step costs besides the model, without a number changing: train_loss and lr are logged only
at the steps the loggers write, and each step reseeds only the generators it draws from."""

from __future__ import annotations

import csv

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from minitx.data.datamodule import TextDataModule
from minitx.training import MinitxLM
from minitx.training import module as module_file

STEPS = 12


class StopAt(L.Callback):
    """Stops the run after optimiser step `step`, as an interrupt or early stopping would."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.should_stop = True


def written(tmp_path, corpus, name: str, every: int, stop_at: int | None = None, accumulate: int = 1) -> dict:
    """{step: (train_loss, lr)} of the metrics.csv of a tiny run logging every `every` steps."""
    L.seed_everything(7, verbose=False)
    data = TextDataModule(
        source="files",
        train_files=str(corpus["train"]),
        val_files=str(corpus["val"]),
        cache_dir=str(corpus["cache"]),
        block_size=32,
        batch_size=8,
        val_batches=2,
    )
    data.setup("fit")
    model = MinitxLM(
        n_layer=1,
        n_head=2,
        d_model=32,
        block_size=32,
        dropout=0.1,
        vocab_size=data.vocab_size,
        max_steps=STEPS,
    )
    trainer = L.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=1,
        logger=CSVLogger(tmp_path, name=name),
        log_every_n_steps=every,
        accumulate_grad_batches=accumulate,
        val_check_interval=6 * accumulate,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[StopAt(stop_at)] if stop_at else [],
    )
    trainer.fit(model, datamodule=data)
    with open(tmp_path / name / "version_0" / "metrics.csv", newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("train_loss")]
    return {int(row["step"]): (row["train_loss"], row["lr"]) for row in rows}


@pytest.mark.parametrize("accumulate", [1, 2])
def test_written_losses_are_their_steps_own_whatever_the_interval_and_where_a_run_stops(
    tmp_path, corpus, accumulate
):
    """Logged every step, every 5th (rows 4 and 9; the train command's checkpoints callback stops
    the run at its last step, which is written then) or stopped by a callback after step 7 (row
    6, not a 5th): each row written holds its own step's train loss and lr, digit for digit, not
    those of the step logged before it."""
    every_step = written(tmp_path, corpus, "every1", 1, accumulate=accumulate)
    assert sorted(every_step) == list(range(STEPS))
    fifth = written(tmp_path, corpus, "every5", 5, accumulate=accumulate)
    assert fifth == {step: every_step[step] for step in (4, 9)}
    stopped = written(tmp_path, corpus, "stopped", 5, stop_at=7, accumulate=accumulate)
    assert stopped == {step: every_step[step] for step in (4, 6)}


def test_a_step_reseeds_the_generators_it_draws_from_as_torch_manual_seed_does(monkeypatch):
    """Dropout masks on a CPU: the CPU generator's state is the one torch.manual_seed sets. Nothing
    is queued for the devices torch.manual_seed would seed lazily (each costs a formatted stack)."""
    torch.manual_seed(123)
    expected = torch.default_generator.get_state()
    torch.manual_seed(0)
    queued = []
    monkeypatch.setattr(torch.cuda, "_lazy_call", lambda *args, **kwargs: queued.append(args))
    module_file.seed_generators(123, torch.device("cpu"))
    assert torch.equal(torch.default_generator.get_state(), expected) and not queued
