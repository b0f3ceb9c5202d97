"""MinitxLM: a Transformer trained as a causal language model (the LightningModule).

What a step does: cross-entropy loss; the optimiser (Muon, or AdamW, with weight decay on matrices
only) and its schedule (warmup, then cosine or WSD), both from optim/; gradient clipping and
accumulation, precision and devices come from the trainer.
Logged: train_loss, lr, tokens_per_sec and mfu (when the device's peak is known; throughput.py),
at the steps the loggers write (every trainer.log_every_n_steps, the last); at each validation,
val_loss and val_ppl (and val_accuracy, val_item_accuracy on tasks with targets).

Exact resumption: a checkpoint holds model, optimiser, scheduler, loop counters and the data
position (the datamodule's batch counter). Dropout needs no saved RNG state: each micro-batch
reseeds torch from (seed, rank, step, micro-batch), so the masks of step n are the same whether
or not the run was interrupted before it, whatever else drew random numbers in between.
"""

from __future__ import annotations

import copy
import inspect
import os
import typing
from dataclasses import asdict, is_dataclass
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..config import ModelConfig
from ..data.toy import IGNORE_INDEX, rows_all_right
from ..errors import UserError
from ..files.upgrade import CHECKPOINT_FORMAT, renamed_key
from ..model import Transformer
from .inputs import errors_named
from .optim import DEFAULTS, Optimisation, Parameters, apply_schedule
from .optim.groups import true_shapes
from .optim.settings import args_entries
from .resume import check_same_model
from .sharding import is_sharded, shard_transformer
from .throughput import ThroughputMeter


def lm_loss(logits: Tensor, y: Tensor) -> Tensor:
    """Mean next-token cross-entropy; targets equal to IGNORE_INDEX (-100) carry no loss."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=IGNORE_INDEX)


class NonFiniteLossError(UserError):
    """The loss became NaN or infinite: the run stops before the bad update is applied."""


def _step_seed(seed: int, rank: int, step: int, micro: int) -> int:
    # SeedSequence mixes the four numbers well; neighbouring steps get unrelated streams.
    return int(np.random.SeedSequence([seed, rank, step, micro]).generate_state(1, np.uint64)[0] >> 1)


def seed_generators(seed: int, device: torch.device) -> None:
    """torch.manual_seed(seed) for the generators a step on `device` draws from: the CPU's, and
    every GPU's on CUDA. torch.manual_seed itself also queues the seed for each device type not
    yet initialised (CUDA on a CPU-only machine, XPU, MTIA), formatting the caller's whole stack
    for each: 0.25-0.8 ms a step under Lightning's loop, for generators no step draws from."""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed_all(seed)  # initialised by now: seeded at once, nothing queued
    elif device.type != "cpu":
        torch.manual_seed(seed)


def _plain(value: Any) -> Any:
    """Dataclasses, tuples and namespaces -> dicts and lists of plain values."""
    if is_dataclass(value) and not isinstance(value, type):
        return _plain(asdict(value))
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


class MinitxLM(L.LightningModule):
    """A Transformer trained as a causal language model.

    The optimiser and schedule settings are one minitx.training.optim.Optimisation, given as
    `optimisation` (Python) or setting by setting under their own names (model.lr, ...,
    model.optimizer_options with each optimiser's own: a config, LightningCLI, the hyperparameters
    a checkpoint saved), never both. Their declaration,
    defaults, checks and descriptions (this docstring's first entries, --help's text) are
    Optimisation's: the signature LightningCLI reads lists its fields in place of `optimisation`
    (`__init__.__signature__`, below), so a setting added there is a model.* key here.

    Args:
        {optimisation}
        max_steps: length of the schedule; linked from trainer.max_steps by the train command.
        compile: torch.compile the Transformer for training and validation steps (sampling and
            generation use the eager module; checkpoint keys stay "model.*").
        activation_checkpointing: recompute each block's activations in backward instead of keeping
            them from forward: less memory for about one more forward's time (the same gradients).
            A training setting, not part of the model's shape: saved configs and exports omit it.
        init_from: a local transformers directory (Llama, Mistral, Ministral, Qwen2) the run starts
            from, recorded here: the train command gives the model its shape before building it
            and loads its weights after (the run keeps block_size, dropout and a non-default
            attention, whose fewer key/value heads are mean-pooled); see minitx/hf/load.py. Or a
            minitx checkpoint (a .ckpt file) of the same shape, at any block_size (learned
            positions extended); see minitx/training/init_from.py.
        allow_noncausal_kinds: train even though a kind from outside minitx lets a future token
            change an earlier output (the train command's probe, minitx/verify/probe.py, refuses
            such a kind otherwise): for a kind meant to see the whole sequence. Recorded in the
            run's config and checkpoints, whose loading then skips the probe.
        **model: the fields of minitx.config.ModelConfig (vocab_size, d_model, attention, ...):
            ModelConfig is their one definition, so a field added there is a model.* key here.
    """

    def __init__(
        self,
        optimisation: Optimisation | None = None,
        max_steps: int = -1,
        compile: bool = False,
        activation_checkpointing: bool = False,
        init_from: str | None = None,
        allow_noncausal_kinds: bool = False,
        **model: Any,
    ):
        super().__init__()
        self.optimisation = optimisation_given(optimisation, model)  # takes its settings out of `model`
        with errors_named("model"):
            # jsonargparse reads ModelConfig's fields from this call: keep it ModelConfig(**model).
            self.config = ModelConfig(**model)
        # Checkpoints must load with weights_only=True: hyperparameters hold plain data only, and
        # the settings by name (each optimiser's own as a mapping under optimizer_options).
        switches = dict(
            max_steps=max_steps,
            compile=compile,
            activation_checkpointing=activation_checkpointing,
            init_from=init_from,
            allow_noncausal_kinds=allow_noncausal_kinds,
        )
        # Set as save_hyperparameters() sets them, which would read each declared argument (lr,
        # ...) from this frame's variables: the settings are one object here.
        self._set_hparams({**_plain(self.optimisation), **switches, **model})
        self._hparams_initial = copy.deepcopy(self._hparams)
        self.hparams.update(self.config.to_dict())
        self.model = Transformer(self.config)
        self.model.checkpoint_activations = activation_checkpointing
        # Every optimiser decides on the unwrapped model's shapes, kept here: FSDP flattens them.
        self.parameter_shapes = true_shapes(list(self.model.named_parameters()))

        self.tokenizer_dict: dict | None = None  # set by the train command; saved in checkpoints
        self.train_config: dict | None = None
        self.last_val: tuple[int, float] | None = None  # (step, val_loss) of the latest validation
        self.throughput: ThroughputMeter | None = None  # from fit start: tokens/s, MFU, tokens seen
        self._val_losses: list[Tensor] = []
        self._val_exact: list[Tensor] = []  # tasks with targets only (the toy task): exact match
        self._val_items: list[Tensor] = []  # ... and accuracy per answer token
        self._reset_step_counters()

    def _reset_step_counters(self) -> None:
        self._micro = 0  # micro-batch index inside the current optimiser step (grad accumulation)
        self._seen_step = -1
        self._loss_sum: Tensor | None = None
        self._step_metrics: tuple[Tensor, float] | None = None  # (train_loss, lr) of the latest micro-batch
        self._logged = False  # whether it logged them

    # -- forward and loss --------------------------------------------------------------------
    def forward(self, idx: Tensor) -> Tensor:
        return self.model(idx)

    def _step_model(self) -> Any:
        """The module the training and validation steps call: compiled when model.compile is set."""
        return self.__dict__.get("_compiled", self.model)

    def scored_logits(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """(logits, targets) at the positions with a target: all of them for text, (B, T, vocab)
        and y; on a task that ignores most positions (IGNORE_INDEX), the output layer runs at the
        N scored ones only, (N, vocab) and (N,): the same loss for a fraction of its cost."""
        scored = y != IGNORE_INDEX
        if bool(scored.all()):  # one host sync per step: cheap beside the step
            return self._step_model()(x), y
        return self._step_model()(x, at=scored), y[scored]

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        return lm_loss(*self.scored_logits(x, y))

    # -- training ----------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        if self.hparams.compile and "_compiled" not in self.__dict__:
            # Kept out of the module tree (written to __dict__, not registered as a submodule),
            # so state_dict keys stay "model.*" and the eager self.model remains for decoding,
            # whose growing cache would recompile a compiled module at every step.
            self.__dict__["_compiled"] = torch.compile(self.model)
        self._seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
        self.throughput = ThroughputMeter(self.device, world_size=self.trainer.world_size)

    def on_train_start(self) -> None:
        self._reset_step_counters()
        self._seen_step = self.global_step
        for config in self.trainer.lr_scheduler_configs:  # after a resume: this run's schedule
            apply_schedule(config.scheduler)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # Dropout masks as a function of (seed, rank, step, micro-batch): see the module docstring.
        seed_generators(_step_seed(self._seed, self.global_rank, self.global_step, self._micro), self.device)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = self.loss(x, y)
        detached = loss.detach()
        self._loss_sum = detached if self._micro == 0 or self._loss_sum is None else self._loss_sum + detached
        self.throughput.add(x.numel() * self.trainer.world_size)
        if self.throughput.flops_per_token is None:
            self.throughput.flops_per_token = self.model.flops_per_token(x.shape[1])
        self._step_metrics = (detached, self.trainer.optimizers[0].param_groups[0]["lr"])
        self._logged = self._logs_this_step()
        if self._logged:
            self._log_step_metrics()
        return loss

    def _logs_this_step(self) -> bool:
        """Whether the trainer writes this step's metrics to its loggers: every
        trainer.log_every_n_steps steps, at the last one, and where the run stops (see
        on_train_batch_end). train_loss and lr are logged at those steps only: each self.log costs
        Lightning about 0.7 ms on a 2-core CPU (it moves its record of the metric to the value's
        device by walking every attribute of the record), two of them 2% of a small model's step. The
        loggers, and the progress lines printed at the same steps, get the same values as when
        every step logged; a progress bar's train_loss changes at those steps only."""
        trainer = self.trainer
        writes = getattr(getattr(trainer, "_logger_connector", None), "should_update_logs", None)
        if writes is None or not trainer.log_every_n_steps or trainer.fast_dev_run:
            return True  # another loop than Lightning's as we know it, or never written: every step
        return bool(writes) or 0 < trainer.max_steps <= self.global_step + 1

    def _log_step_metrics(self) -> None:
        loss, lr = self._step_metrics
        self.log("train_loss", loss, prog_bar=True)
        self.log("lr", lr)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # After backward, before the update: a NaN/inf loss stops the run with the weights (and
        # the last checkpoint) as they were. Every rank takes the same decision, or DDP would hang.
        bad = self._loss_sum is not None and not bool(torch.isfinite(self._loss_sum).item())
        bad = self.trainer.strategy.reduce_boolean_decision(bad, all=False)
        if bad:
            value = float(self._loss_sum) if self._loss_sum is not None else float("nan")
            raise NonFiniteLossError(
                f"step {self.global_step}: the training loss is {value} (not finite); the run stopped "
                "before applying this update and the last checkpoint was left as it was; lower model.lr, "
                "raise model.warmup_steps or set trainer.gradient_clip_val, then resume with --ckpt_path last"
            )

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._micro += 1
        if self.global_step == self._seen_step:
            return  # accumulating: no optimiser step yet
        self._micro = 0
        self._seen_step = self.global_step
        if self.trainer.should_stop and not self._logged:
            # A callback stopped the run at this step (an interrupt, early stopping): the loggers
            # write it, so its own loss and lr are logged, under training_step's name as always
            # (this hook runs after the callbacks' and before the loggers are written).
            hook, self._current_fx_name = self._current_fx_name, "training_step"
            try:
                self._log_step_metrics()
            finally:
                self._current_fx_name = hook
        if not self.throughput.started():
            self.throughput.lap()  # the first step of a run includes warm-up (and compilation): time from its end
        elif self.global_step % max(1, self.trainer.log_every_n_steps) == 0:
            tokens_per_sec = self.throughput.lap()
            self.log("tokens_per_sec", tokens_per_sec, prog_bar=True)
            if (mfu := self.throughput.mfu(tokens_per_sec)) is not None:
                self.log("mfu", mfu)

    # -- validation --------------------------------------------------------------------------
    def on_validation_start(self) -> None:
        if self.throughput is not None and not self.trainer.sanity_checking:
            self.throughput.pause()  # validation is not training throughput

    def on_validation_end(self) -> None:
        if self.throughput is not None:
            self.throughput.resume()

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        logits, targets = self.scored_logits(x, y)
        self._val_losses.append(lm_loss(logits, targets).detach())
        if targets.dim() == 1:  # only some positions are targets: score answers and whole rows too
            right = logits.argmax(-1) == targets
            self._val_exact.append(rows_all_right(right, y != IGNORE_INDEX))
            self._val_items.append(right.float().mean())

    def on_validation_epoch_end(self) -> None:
        if not self._val_losses:
            return
        mean = self._mean_over_ranks(self._val_losses)
        self.log("val_loss", mean, prog_bar=True, sync_dist=True)
        self.log("val_ppl", mean.exp(), sync_dist=True)
        if self._val_exact:
            self.log("val_accuracy", self._mean_over_ranks(self._val_exact), prog_bar=True, sync_dist=True)
            # Per answer token (Zoology's MQAR accuracy: per query), beside whole rows above.
            self.log("val_item_accuracy", self._mean_over_ranks(self._val_items), sync_dist=True)
        if not self.trainer.sanity_checking:
            self.last_val = (self.global_step, float(mean))

    def _mean_over_ranks(self, values: list[Tensor]) -> Tensor:
        """The mean of a validation's `values` (then emptied), over every process."""
        mean = torch.stack(values).float().mean()
        values.clear()
        return self.trainer.strategy.reduce(mean, reduce_op="mean")

    # -- sharding ----------------------------------------------------------------------------
    def configure_model(self) -> None:
        """Under `--trainer.strategy fsdp2` (Lightning's model-parallel strategies give the module a
        device mesh): shard the Transformer (sharding.py). bf16-mixed precision gathers bfloat16
        weights and reduces gradients in float32. Nothing to do in one process or under DDP."""
        mesh = self._device_mesh
        if mesh is None or is_sharded(self.model):  # fit then validate: configured once
            return
        bf16 = str(self.trainer.precision).startswith("bf16")
        shard_transformer(self.model, mesh["data_parallel"], bf16=bf16)

    # -- optimiser ---------------------------------------------------------------------------
    def configure_optimizers(self) -> dict:
        hp = self.hparams
        max_steps = hp.max_steps if hp.max_steps > 0 else (self.trainer.max_steps if self._trainer else -1)
        if max_steps < 1:
            raise UserError(
                "trainer.max_steps: must be set to the number of optimiser steps (the training data never runs out)"
            )
        params = Parameters(
            list(self.model.named_parameters()), self.parameter_shapes, fused=self.device.type == "cuda"
        )
        # A resume may have replaced the optimizer with the checkpoint's (training/command.py).
        return self.optimisation.configure(params, max_steps)

    # -- checkpoints -------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # Generation reads this entry and nothing else (see minitx/files/checkpoint.py).
        checkpoint["minitx"] = {
            "format": CHECKPOINT_FORMAT,
            "model_config": self.config.to_dict(),
            "tokenizer": self.tokenizer_dict,
            "train_config": self.train_config,
        }
        hparams = checkpoint.get("hyper_parameters")
        if isinstance(hparams, dict):
            checkpoint["hyper_parameters"] = _plain(hparams)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # train.py checked the file already (check_resume_checkpoint); this guards Trainer.fit(ckpt_path=...)
        # called from Python.
        saved = checkpoint.get("minitx", {})
        if saved.get("format") != CHECKPOINT_FORMAT:
            raise UserError(
                f"ckpt_path: checkpoint format {saved.get('format')!r} is not {CHECKPOINT_FORMAT}; it was not written by this minitx"
            )
        check_same_model(saved, self.config)


def optimisation_given(optimisation: Optimisation | None, settings: dict) -> Optimisation:
    """The optimiser settings MinitxLM was given: `optimisation`, or those of its fields among
    `settings` (removed from it; one left out takes its default), checked."""
    for name in settings:  # an optimiser's own setting as an earlier minitx spelled it: model.muon_lr
        if renamed := renamed_key(f"model.{name}"):
            raise UserError(
                f"model.{name}: this setting is now {renamed}; write that instead (the value is the same)"
            )
    named = {name: settings.pop(name) for name in Optimisation.names() if name in settings}
    if optimisation is not None and named:
        raise UserError(
            f"model: give the optimiser settings as `optimisation` or by name, not both ({', '.join(named)})"
        )
    return optimisation if optimisation is not None else Optimisation(**named)


def _declared_signature() -> inspect.Signature:
    """MinitxLM.__init__'s signature with Optimisation's fields in place of `optimisation`: the
    model.* keys LightningCLI reads (with ModelConfig's, through **model), each typed and with
    its default, as configs and checkpoints spell them."""
    signature = inspect.signature(MinitxLM.__init__)
    own = list(signature.parameters.values())
    keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD
    types = typing.get_type_hints(Optimisation)  # types, not the strings of postponed annotations
    fields = [
        inspect.Parameter(name, keyword, default=getattr(DEFAULTS, name), annotation=hint)
        for name, hint in types.items()
    ]
    return signature.replace(parameters=[own[0], *fields, *own[2:]])


# Optimisation's "Args:" entries (the same indentation as MinitxLM's) in MinitxLM's docstring,
# which is --help's text for model.*.
MinitxLM.__doc__ = MinitxLM.__doc__.replace("{optimisation}", args_entries(Optimisation).strip())
MinitxLM.__init__.__signature__ = _declared_signature()
