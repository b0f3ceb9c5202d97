"""Training: the LightningModule and the `train` command, one file per concern.

    module.py      MinitxLM (loss, steps, validation, checkpoint hooks)
    optim.py       AdamW groups (decay on matrices only), warmup + cosine schedule
    throughput.py  tokens/s and MFU (the device peak table), one meter for every consumer
    run.py         RunSettings (the `run` section), run directory, atomic CheckpointIO, last/best callback
    resume.py      checks that a checkpoint can be resumed, made before anything is written
    messages.py    jsonargparse's errors as one line
    command.py     TrainCLI (LightningCLI), `main`, check_train_args

Imports flow down that list's dependencies only: command -> (module, run, resume, messages) ->
(optim, throughput); nothing here imports minitx.cli.
"""

from .command import DEFAULT_CONFIG, TrainCLI, check_train_args, main, sample_text
from .module import MinitxLM, NonFiniteLossError, lm_loss
from .optim import decays, lr_at, optimizer_groups
from .run import AtomicCheckpointIO, RunCheckpoints, RunSettings
from .throughput import ThroughputMeter, format_mfu, peak_flops

__all__ = [
    "AtomicCheckpointIO",
    "DEFAULT_CONFIG",
    "MinitxLM",
    "NonFiniteLossError",
    "RunCheckpoints",
    "RunSettings",
    "ThroughputMeter",
    "TrainCLI",
    "check_train_args",
    "decays",
    "format_mfu",
    "lm_loss",
    "lr_at",
    "main",
    "optimizer_groups",
    "peak_flops",
    "sample_text",
]
