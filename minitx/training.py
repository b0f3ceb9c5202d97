"""Training: the LightningModule and the `train` command.

    python train.py                                   # configs/default.yaml
    python train.py --config configs/gqa.yaml --model.attention.n_kv_head 2 --trainer.max_steps 500
    python train.py --config configs/gqa.yaml --ckpt_path last      # resume runs/<name>/checkpoints/last.ckpt
    python train.py --config configs/default.yaml --print_config    # the resolved configuration

YAML + flags -> LightningCLI (jsonargparse) -> MinitxLM(Transformer) + TextDataModule + Trainer.
Every field of the model, data, optimiser and trainer is a config key and a dotted flag; the model's
vocab_size comes from the data's tokenizer and data.block_size from model.block_size.

What a step does: cross-entropy loss; AdamW with weight decay on matrices only; linear warmup then
cosine decay to min_lr, stepped every optimiser step; gradient clipping and accumulation, precision
and devices from the trainer section. Logged: train_loss, lr, tokens_per_sec, mfu (when the device's
peak is known) and, at each validation, val_loss and val_ppl.

Exact resumption: a checkpoint holds model, optimiser, scheduler, loop counters and the data
position (the datamodule's batch counter). Dropout needs no saved RNG state: each micro-batch
reseeds torch from (seed, rank, step, micro-batch), so the masks of step n are the same whether
or not the run was interrupted before it, whatever else drew random numbers in between.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
import re
import sys
import time
import warnings
from dataclasses import asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal, Optional, Sequence

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
import yaml
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger
from torch import Tensor

from .checkpoint import BEST, CHECKPOINT_FORMAT, LAST, read_checkpoint, state_mismatch
from .config import AttentionConfig, ModelConfig
from .data.datamodule import TextDataModule
from .data.toy import IGNORE_INDEX, exact_match
from .errors import UserError, one_line
from .model import Transformer
from .run_checkpoints import AtomicCheckpointIO, RunCheckpoints

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO_ROOT / "configs" / "default.yaml"

_DEFAULT_MODEL = ModelConfig()  # the module's defaults are read from here: one source of truth


# ------------------------------------------------------------------------------------------------
# Throughput and model FLOPs utilisation

# Dense (no sparsity) bf16 tensor-core peak FLOP/s, from the vendors' datasheets, matched against
# torch.cuda.get_device_name(). The most specific names come first. MFU is always quoted against
# this bf16 peak, as nanoGPT and PaLM do, whatever precision the run uses.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H200 NVL", 835e12),
    ("H200", 989e12),
    ("H100 NVL", 835e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),  # SXM
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
)


def peak_flops(device: torch.device) -> Optional[float]:
    """Peak FLOP/s of one `device`, or None when unknown (CPUs, unlisted GPUs): never a guess."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, flops in PEAK_BF16_FLOPS:
        if key in name:
            return flops
    return None


def format_mfu(mfu: Optional[float]) -> str:
    return "unknown" if mfu is None else f"{100 * mfu:.1f}%"


# ------------------------------------------------------------------------------------------------
# Optimiser groups and the learning-rate schedule

# MTA's key-query convolution and head-mixing matrices start as the identity. Weight decay pulls
# parameters towards zero, which for these means towards "no attention" rather than towards the
# plain attention they start from, so they are not decayed even though they are matrices.
NO_DECAY_NAMES = ("kq_conv", "mix_pre", "mix_post")
# Prefixes wrappers put in parameter names (FSDP, activation checkpointing, torch.compile).
_WRAPPER_PREFIXES = re.compile(r"(_fsdp_wrapped_module\.|_checkpoint_wrapped_module\.|_orig_mod\.)")


def decays(name: str, param: Tensor) -> bool:
    """Weight decay on matrices (dim >= 2: linear weights, and embeddings as in nanoGPT), not on
    norms, biases, gates' biases or MTA's identity-initialised kernels."""
    return param.dim() >= 2 and name.rsplit(".", 1)[-1] not in NO_DECAY_NAMES


def optimizer_groups(named_params: Sequence[tuple[str, Tensor]], weight_decay: float, decay_names: Optional[set[str]] = None) -> list[dict]:
    """Two AdamW groups: decayed matrices and undecayed rest. `decay_names` (clean names) overrides
    the shape rule, for wrappers such as FSDP that flatten parameters after the decision was made."""
    decay, no_decay = [], []
    for name, param in named_params:
        if not param.requires_grad:
            continue
        clean = _WRAPPER_PREFIXES.sub("", name)
        wants_decay = clean in decay_names if decay_names is not None else decays(clean, param)
        (decay if wants_decay else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def lr_at(step: int, lr: float, min_lr: float, warmup_steps: int, max_steps: int) -> float:
    """Linear warmup from lr/warmup_steps to lr over `warmup_steps`, then cosine decay to `min_lr`
    at `max_steps`, and min_lr after that."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


# ------------------------------------------------------------------------------------------------
# The LightningModule


def lm_loss(logits: Tensor, y: Tensor) -> Tensor:
    """Mean next-token cross-entropy; targets equal to IGNORE_INDEX (-100) carry no loss."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=IGNORE_INDEX)


class NonFiniteLossError(UserError):
    """The loss became NaN or infinite: the run stops before the bad update is applied."""


def _step_seed(seed: int, rank: int, step: int, micro: int) -> int:
    # SeedSequence mixes the four numbers well; neighbouring steps get unrelated streams.
    return int(np.random.SeedSequence([seed, rank, step, micro]).generate_state(1, np.uint64)[0] >> 1)


class MinitxLM(L.LightningModule):
    """A Transformer trained as a causal language model.

    Model args are ModelConfig's fields (see minitx/config.py); the rest:
        lr, min_lr: peak and final learning rate of the warmup + cosine schedule.
        warmup_steps: optimiser steps of linear warmup.
        max_steps: length of the cosine; linked from trainer.max_steps by the train command.
        weight_decay: AdamW decay on matrices only (see `decays`).
        betas, eps: AdamW's.
        compile: torch.compile the Transformer for training and validation steps (sampling and
            generation use the eager module; checkpoint keys stay "model.*").
    """

    def __init__(
        self,
        vocab_size: int = _DEFAULT_MODEL.vocab_size,
        block_size: int = _DEFAULT_MODEL.block_size,
        n_layer: int = _DEFAULT_MODEL.n_layer,
        n_head: int = _DEFAULT_MODEL.n_head,
        d_model: int = _DEFAULT_MODEL.d_model,
        mlp: Literal["gelu", "swiglu"] = _DEFAULT_MODEL.mlp,
        norm: Literal["rmsnorm", "layernorm"] = _DEFAULT_MODEL.norm,
        positions: Literal["rope", "learned"] = _DEFAULT_MODEL.positions,
        dropout: float = _DEFAULT_MODEL.dropout,
        bias: bool = _DEFAULT_MODEL.bias,
        tie_embeddings: bool = _DEFAULT_MODEL.tie_embeddings,
        attention: AttentionConfig = _DEFAULT_MODEL.attention,
        lr: float = 1e-3,
        min_lr: float = 1e-4,
        warmup_steps: int = 100,
        max_steps: int = -1,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        compile: bool = False,
    ):
        super().__init__()
        self.config = model_config(
            dict(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, n_head=n_head, d_model=d_model,
                 mlp=mlp, norm=norm, positions=positions, dropout=dropout, bias=bias,
                 tie_embeddings=tie_embeddings, attention=attention),
        )
        _check_optimiser("model", lr=lr, min_lr=min_lr, warmup_steps=warmup_steps, weight_decay=weight_decay, betas=betas)
        self.save_hyperparameters()
        # Checkpoints must load with weights_only=True: hyperparameters hold plain data only.
        self.hparams["attention"] = asdict(self.config.attention)
        self.hparams["betas"] = [float(b) for b in betas]
        self.model = Transformer(self.config)
        # The decay decision is made here, on the unwrapped model, where shapes are still true.
        self.decay_names = {name for name, p in self.model.named_parameters() if decays(name, p)}

        self.tokenizer_dict: Optional[dict] = None  # set by the train command; saved in checkpoints
        self.train_config: Optional[dict] = None
        self.last_val: Optional[tuple[int, float]] = None  # (step, val_loss) of the latest validation
        self._val_losses: list[Tensor] = []
        self._val_exact: list[Tensor] = []  # tasks with targets only (the toy task): exact match
        self._reset_step_counters()

    def _reset_step_counters(self) -> None:
        self._micro = 0  # micro-batch index inside the current optimiser step (grad accumulation)
        self._seen_step = -1
        self._loss_sum: Optional[Tensor] = None
        self._window_start: Optional[float] = None
        self._window_tokens = 0

    # -- forward and loss --------------------------------------------------------------------
    def forward(self, idx: Tensor) -> Tensor:
        return self.model(idx)

    def _step_model(self) -> Any:
        """The module the training and validation steps call: compiled when model.compile is set."""
        compiled = self.__dict__.get("_compiled")
        return self.model if compiled is None else compiled

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        return lm_loss(self._step_model()(x), y)

    # -- training ----------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        if self.hparams.compile and self.__dict__.get("_compiled") is None:
            # Kept out of the module tree (written to __dict__, not registered as a submodule),
            # so state_dict keys stay "model.*" and the eager self.model remains for decoding,
            # whose growing cache would recompile a compiled module at every step.
            self.__dict__["_compiled"] = torch.compile(self.model)
        self._seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
        self._peak = peak_flops(self.device)
        self._flops_per_token: Optional[float] = None  # known at the first batch, from its length

    def on_train_start(self) -> None:
        self._reset_step_counters()
        self._seen_step = self.global_step

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # Dropout masks as a function of (seed, rank, step, micro-batch): see the module docstring.
        torch.manual_seed(_step_seed(self._seed, self.global_rank, self.global_step, self._micro))

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = self.loss(x, y)
        detached = loss.detach()
        self._loss_sum = detached if self._micro == 0 or self._loss_sum is None else self._loss_sum + detached
        self._window_tokens += x.numel() * self.trainer.world_size
        if self._flops_per_token is None:
            self._flops_per_token = self.model.flops_per_token(x.shape[1])
        self.log("train_loss", detached, prog_bar=True)
        self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss

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
        now = time.perf_counter()
        if self._window_start is None:
            # The first step of a run includes warm-up (and compilation): measure from its end.
            self._window_start, self._window_tokens = now, 0
            return
        if self.global_step % max(1, self.trainer.log_every_n_steps) == 0:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
                now = time.perf_counter()
            tokens_per_sec = self._window_tokens / max(now - self._window_start, 1e-9)
            self._window_start, self._window_tokens = now, 0
            self.log("tokens_per_sec", tokens_per_sec, prog_bar=True)
            mfu = self.mfu(tokens_per_sec)
            if mfu is not None:
                self.log("mfu", mfu)

    def mfu(self, tokens_per_sec: float) -> Optional[float]:
        """Model FLOPs utilisation: achieved training FLOP/s over the devices' peak, or None."""
        peak = getattr(self, "_peak", None)
        if peak is None or self._flops_per_token is None:
            return None
        return self._flops_per_token * tokens_per_sec / (peak * self.trainer.world_size)

    # -- validation --------------------------------------------------------------------------
    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self._step_model()(x)
        self._val_losses.append(lm_loss(logits, y).detach())
        if (y == IGNORE_INDEX).any():  # only some positions are targets: score whole answers too
            self._val_exact.append(exact_match(logits, y))

    def on_validation_epoch_end(self) -> None:
        if not self._val_losses:
            return
        mean = torch.stack(self._val_losses).float().mean()
        self._val_losses.clear()
        mean = self.trainer.strategy.reduce(mean, reduce_op="mean")
        self.log("val_loss", mean, prog_bar=True, sync_dist=True)
        self.log("val_ppl", mean.exp(), sync_dist=True)
        if self._val_exact:
            accuracy = torch.stack(self._val_exact).mean()
            self._val_exact.clear()
            self.log("val_accuracy", self.trainer.strategy.reduce(accuracy, reduce_op="mean"), prog_bar=True, sync_dist=True)
        if not self.trainer.sanity_checking:
            self.last_val = (self.global_step, float(mean))

    # -- optimiser ---------------------------------------------------------------------------
    def configure_optimizers(self) -> dict:
        hp = self.hparams
        max_steps = hp.max_steps if hp.max_steps > 0 else (self.trainer.max_steps if self._trainer else -1)
        if max_steps < 1:
            raise UserError("trainer.max_steps: must be set to the number of optimiser steps (the training data never runs out)")
        groups = optimizer_groups(list(self.model.named_parameters()), hp.weight_decay, self.decay_names)
        optimizer = torch.optim.AdamW(
            groups, lr=hp.lr, betas=tuple(hp.betas), eps=hp.eps, fused=self.device.type == "cuda"
        )

        def factor(step: int) -> float:  # a plain function: LambdaLR keeps no state of it
            return lr_at(step, hp.lr, hp.min_lr, hp.warmup_steps, max_steps) / hp.lr

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1}}

    # -- checkpoints -------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # Generation reads this entry and nothing else (see minitx/checkpoint.py).
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
            raise UserError(f"ckpt_path: checkpoint format {saved.get('format')!r} is not {CHECKPOINT_FORMAT}; it was not written by this minitx")
        check_same_model(saved, self.config)


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


def _dict_diff(old: dict, new: dict, prefix: str = "") -> str:
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found = _dict_diff(a, b, f"{prefix}{key}.")
            if found:
                return found
        elif a != b:
            return f"{prefix}{key}: checkpoint {a!r}, config {b!r}"
    return ""


def model_config(fields_of_config: dict) -> ModelConfig:
    """The ModelConfig of the `model` section's config fields, every check run, errors naming
    `model.<field>`. `attention` may be a dict (from YAML) or an AttentionConfig."""
    fields_of_config = dict(fields_of_config)
    attention = fields_of_config.get("attention")
    if isinstance(attention, dict):
        fields_of_config["attention"] = _build("model.attention", AttentionConfig, attention)
    elif is_dataclass(attention):
        fields_of_config["attention"] = AttentionConfig(**asdict(attention))  # a private copy, never the shared default
    return _build("model", ModelConfig, fields_of_config)


def check_model_section(section: dict) -> None:
    """The checks MinitxLM's constructor makes, without building the network (see check_train_args)."""
    config_fields = {f.name for f in fields(ModelConfig)}
    model_config({key: value for key, value in section.items() if key in config_fields})
    _check_optimiser("model", **{key: section[key] for key in ("lr", "min_lr", "warmup_steps", "weight_decay", "betas")})


def _build(prefix: str, cls: type, kwargs: dict) -> Any:
    """cls(**kwargs), with its error (a UserError or ValueError naming the field, e.g.
    "attention.n_kv_head: ...") turned into a UserError naming the config key ("model.attention.n_kv_head")."""
    try:
        return cls.from_dict(kwargs) if hasattr(cls, "from_dict") else cls(**kwargs)
    except (ValueError, TypeError) as err:  # UserError is a ValueError
        message = str(err)
        if prefix == "model.attention" and message.startswith("attention"):
            prefix = "model"
        raise UserError(f"{prefix}.{message}") from None


def _check_optimiser(prefix: str, *, lr: float, min_lr: float, warmup_steps: int, weight_decay: float, betas: Sequence[float]) -> None:
    if not lr > 0:
        raise UserError(f"{prefix}.lr: is {lr}; use a positive learning rate such as 1e-3")
    if not 0 <= min_lr <= lr:
        raise UserError(f"{prefix}.min_lr: is {min_lr}; use a value between 0 and model.lr={lr}")
    if warmup_steps < 0:
        raise UserError(f"{prefix}.warmup_steps: is {warmup_steps}; use 0 or more")
    if weight_decay < 0:
        raise UserError(f"{prefix}.weight_decay: is {weight_decay}; use 0 or more")
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise UserError(f"{prefix}.betas: is {list(betas)}; use two numbers in [0, 1), e.g. [0.9, 0.95]")


# ------------------------------------------------------------------------------------------------
# Sampling at the end of a run


def prompt_ids(prompt: str, tokenizer: Any, is_default: bool) -> list[int]:
    """The sample's prompt as ids; the default prompt ("\n") falls back to id 0 in a vocabulary
    without a newline (the toy task), a prompt the user chose must encode."""
    try:
        return tokenizer.encode(prompt) or [0]
    except UserError as err:
        if is_default:
            return [0]
        raise UserError(f"run.sample_prompt: {err}") from None


@torch.no_grad()
def sample_text(model: Transformer, tokenizer: Any, ids: list[int], max_new_tokens: int, temperature: float = 0.8, top_k: Optional[int] = 200) -> str:
    """A continuation of the prompt `ids` from `model`, decoded (prompt included)."""
    was_training = model.training
    model.eval()
    idx = torch.tensor([ids], dtype=torch.long, device=next(model.parameters()).device)
    try:
        out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k)
    except ImportError:
        out = _sample_loop(model, idx, max_new_tokens, temperature, top_k)  # minitx.generation absent
    finally:
        model.train(was_training)
    return tokenizer.decode(out[0].tolist())


def _sample_loop(model: Transformer, idx: Tensor, max_new_tokens: int, temperature: float, top_k: Optional[int]) -> Tensor:
    for _ in range(max_new_tokens):
        logits = model(idx[:, -model.config.block_size:])[:, -1].float() / max(temperature, 1e-6)
        if top_k is not None and top_k < logits.size(-1):
            kth = torch.topk(logits, top_k).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        idx = torch.cat([idx, torch.multinomial(F.softmax(logits, dim=-1), 1)], dim=1)
    return idx


# ------------------------------------------------------------------------------------------------
# The train command


@dataclass
class RunSettings:
    """Where a run writes and what it does besides training.

    name: the run directory is <root>/<name>; --ckpt_path last resumes from it. Unset: the name
        of the (last) config file, e.g. "gqa" for --config configs/gqa.yaml.
    root: parent directory of run directories.
    checkpoint_every_n_steps: also refresh last.ckpt every N optimiser steps (0: only at
        validations and at the end).
    keep_every_n_steps: keep each timed checkpoint as step-<N>.ckpt instead of only refreshing last.ckpt.
    wandb: also log to Weights & Biases (WANDB_MODE=offline works without an account).
    wandb_project: the W&B project.
    wandb_group: the W&B run group (the ablation command puts one sweep in one group).
    sample_tokens: tokens sampled from the trained model at the end (0: none).
    sample_prompt: text the sample starts from.
    sample_temperature: softmax temperature of that sample.
    """

    name: Optional[str] = None
    root: str = "runs"
    checkpoint_every_n_steps: int = 0
    keep_every_n_steps: bool = False
    wandb: bool = False
    wandb_project: str = "minitx"
    wandb_group: Optional[str] = None
    sample_tokens: int = 200
    sample_prompt: str = "\n"
    sample_temperature: float = 0.8

    @property
    def dir(self) -> Path:
        return Path(self.root).expanduser() / (self.name or "default")

    @property
    def checkpoint_dir(self) -> Path:
        return self.dir / "checkpoints"


class TrainCLI(LightningCLI):
    """LightningCLI without subcommands: parse, build, and let `main` call fit."""

    def __init__(self, args: Sequence[str]):
        super().__init__(
            MinitxLM,
            TextDataModule,
            args=list(args),
            run=False,
            save_config_callback=None,  # main() writes <run dir>/config.yaml itself
            seed_everything_default=1337,
            auto_configure_optimizers=False,  # MinitxLM.configure_optimizers owns the optimiser
            parser_kwargs={"exit_on_error": False, "description": "Train a minitx language model."},
            trainer_defaults={
                # The training loader never ends: validation is scheduled in steps, runs in max_steps.
                "check_val_every_n_epoch": None,
                "val_check_interval": 250,
                "max_steps": 5000,
                "log_every_n_steps": 10,
                # Lightning would merge the module's and datamodule's hparams and trip over the two
                # meanings of vocab_size; main() logs the whole resolved config instead.
                "enable_autolog_hparams": False,
            },
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_class_arguments(RunSettings, "run")
        parser.add_argument(
            "--ckpt_path",
            type=Optional[str],
            default=None,
            help="Resume from this checkpoint: a path, or 'last' / 'best' in <run.root>/<run.name>/checkpoints/.",
        )
        parser.link_arguments("model.block_size", "data.block_size")
        parser.link_arguments("trainer.max_steps", "model.max_steps")
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        from jsonargparse import ArgumentError

        try:
            super().parse_arguments(parser, args)
        except ArgumentError as err:  # exit_on_error=False: jsonargparse raises instead of exiting
            raise UserError(parse_error_message(err, parser, _config_files(args))) from None

    def before_instantiate_classes(self) -> None:
        if self.config["run"]["name"] is None:
            config_files = self.config.get("config") or []
            self.config["run"]["name"] = Path(str(config_files[-1])).stem if config_files else "default"

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except (ValueError, TypeError) as err:  # UserError is a ValueError
            # jsonargparse may wrap what a constructor raised; find a UserError inside if there is one.
            inner = _find_user_error(err)
            if inner is None:
                raise UserError(one_line(err)) from None
            if str(inner).startswith("attention"):
                # jsonargparse built model.attention (an AttentionConfig) itself: name the config key.
                raise UserError(f"model.{inner}") from None
            raise inner from None

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list) -> L.Trainer:
        run = _run_settings(self.config_init["run"])
        config = dict(config)
        config["default_root_dir"] = str(run.dir)
        config["callbacks"] = list(config.get("callbacks") or []) + [
            RunCheckpoints(run.checkpoint_dir, run.checkpoint_every_n_steps, run.keep_every_n_steps)
        ]
        plugins = config.get("plugins") or []
        config["plugins"] = (list(plugins) if isinstance(plugins, list) else [plugins]) + [AtomicCheckpointIO()]
        if config.get("logger") in (None, True):
            loggers: list = [CSVLogger(save_dir=str(run.dir), name="logs")]
            if run.wandb:
                from lightning.pytorch.loggers import WandbLogger

                # WANDB_DIR, when set, wins: the user asked for W&B files to go there.
                loggers.append(WandbLogger(project=run.wandb_project, name=run.name, group=run.wandb_group, save_dir=os.environ.get("WANDB_DIR", str(run.dir))))
            config["logger"] = loggers
        try:
            return super()._instantiate_trainer(config, callbacks)
        except UserError:
            raise
        except Exception as err:
            from lightning.fabric.utilities.exceptions import MisconfigurationException

            if isinstance(err, (MisconfigurationException, ValueError)):
                raise UserError(f"trainer: {one_line(err)}") from None
            raise


class _CheckOnlyCLI(TrainCLI):
    """Parses a train command line exactly as `train` does and runs the model and optimiser
    checks, but builds nothing: no data is read, no network allocated, no seed set."""

    def _set_seed(self) -> None:
        pass

    def before_instantiate_classes(self) -> None:
        pass

    def instantiate_classes(self) -> None:
        check_model_section(self.config["model"].as_dict())


def check_train_args(args: Sequence[str]) -> None:
    """Raise the UserError `train` would raise for a mistake in the config (unknown key, wrong
    type, bad model or optimiser value), in a second or two: `ablate` checks every variant
    this way before any run starts. Data and checkpoints are not looked at."""
    _quiet_lightning()
    _CheckOnlyCLI(list(args))


def _run_settings(value: Any) -> RunSettings:
    if isinstance(value, RunSettings):
        return value
    return RunSettings(**(value.as_dict() if hasattr(value, "as_dict") else dict(value)))


def _find_user_error(err: BaseException) -> Optional[UserError]:
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, UserError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


# Known noise from Lightning that says nothing about a minitx run.
_QUIET_WARNINGS = (
    r".*LightningCLI.s args parameter is intended.*",  # main() always passes args explicitly
    r".*does not have many workers.*",  # our loader slices a memmap: workers rarely help
    r".*`isinstance\(treespec, LeafSpec\)` is deprecated.*",
)


class _DropLightningTips(logging.Filter):
    """Lightning 2.6 advertises cloud products at every start; that is not about this run."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("\N{ELECTRIC LIGHT BULB} Tip")


def _quiet_lightning() -> None:
    for pattern in _QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    for handler in logging.getLogger("lightning.pytorch").handlers:
        if not any(isinstance(f, _DropLightningTips) for f in handler.filters):
            handler.addFilter(_DropLightningTips())


def _with_default_config(args: list[str]) -> list[str]:
    """No --config given: train configs/default.yaml (flags still override it)."""
    has_config = any(a in ("-c", "--config") or a.startswith("--config=") for a in args)
    if has_config or not DEFAULT_CONFIG.is_file():
        return args
    return ["--config", str(DEFAULT_CONFIG)] + args


def parse_error_message(err: BaseException, parser: Any = None, config_files: Sequence[str] = ()) -> str:
    """jsonargparse's (sometimes multi-line) error -> one line, with a did-you-mean for unknown keys
    and the name of the config file where jsonargparse only says "<unicode string>"."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    message = " ".join(lines[:3]) if lines else type(err).__name__
    files = " or ".join(repr(str(f)) for f in config_files) or "the config file"
    if '"<unicode string>"' in message:  # a YAML error inside a config file
        message = message.replace('"<unicode string>"', files)
        if "could not determine a constructor for the tag" in message:
            message += "; config files are read as plain YAML (safe loading): remove the tag"
        else:
            message += "; fix the YAML there"
    elif message.startswith("Unexpected config"):  # the file is YAML, but not a mapping
        message = f"--config: {files} is not a mapping of sections (model:, data:, trainer:, run:); see configs/default.yaml"
    message = _plain_type_error(message)
    unknown = _unknown_key(message)
    if unknown and parser is not None:
        close = difflib.get_close_matches(unknown, _known_keys(parser), n=1, cutoff=0.6)
        if close:
            message += f"; did you mean {close[0]!r}?"
    return message


_WRONG_TYPE = re.compile(r'^Parser key "(?P<key>[\w.]+)": Expected a (?P<type>.+?)\. Got value: (?P<value>.*)$')
_NO_UNION_TYPE = re.compile(r'^Parser key "(?P<key>[\w.]+)": Does not validate against any of the Union subtypes Subtypes: \[(?P<types>.*)\]$')
_TYPE_WORDS = {"int": "a whole number", "float": "a number", "bool": "true or false", "str": "text", "NoneType": "null",
               "tuple": "a list", "list": "a list", "dict": "a mapping"}


def _type_in_words(type_text: str) -> str:
    """"<class 'int'>" -> "a whole number", "typing.Literal['a', 'b']" -> "one of a, b", "list[int]" -> "a list"."""
    literal = re.fullmatch(r"typing\.Literal\[(.*)\]", type_text.strip())
    if literal:
        return "one of " + ", ".join(choice.strip().strip("'\"") for choice in literal.group(1).split(","))
    name = re.fullmatch(r"<class '(\w+)'>|(\w+)(\[.*\])?", type_text.strip())
    if name:
        return _TYPE_WORDS.get(name.group(1) or name.group(2), type_text.strip())
    return type_text.strip()


def _plain_type_error(message: str) -> str:
    """jsonargparse's type errors ("Expected a <class 'int'>. Got value: two") -> "<key>: <problem>; <fix>"."""
    wrong = _WRONG_TYPE.match(message)
    if wrong:
        expected = _type_in_words(wrong["type"])
        if expected.startswith("one of "):
            return f"{wrong['key']}: unknown value {wrong['value']!r}; choose {expected}"
        return f"{wrong['key']}: {wrong['value']!r} is not {expected}; give {expected}"
    union = _NO_UNION_TYPE.match(message)
    if union:
        # Split the subtypes at the commas between them, not those inside Literal[...] or list[...].
        types = [t for t in re.split(r",\s*(?![^\[]*\])", union["types"]) if t.strip()]
        words = [_type_in_words(t) for t in types]
        choices = [choice for w in words if w.startswith("one of ") for choice in w[len("one of "):].split(", ")]
        others = [w for w in words if not w.startswith("one of ")]
        expected = " or ".join(dict.fromkeys(([f"one of {', '.join(dict.fromkeys(choices))}"] if choices else []) + others))
        return f"{union['key']}: the value given is not accepted; give {expected}"
    return message


def _config_files(args: Any) -> list[str]:
    """The values of --config / -c in a command line."""
    args = list(args) if isinstance(args, (list, tuple)) else []
    files = [value for flag, value in zip(args, args[1:]) if flag in ("--config", "-c")]
    return files + [arg.split("=", 1)[1] for arg in args if isinstance(arg, str) and arg.startswith("--config=")]


def _unknown_key(message: str) -> Optional[str]:
    """The key jsonargparse refused, from its three phrasings (flag, YAML key, key inside a group)."""
    flag = re.search(r"unrecognized arguments: --([\w.]+)", message, re.IGNORECASE)
    if flag:
        return flag.group(1)
    option = re.search(r"Option '([\w.]+)' is not accepted", message)
    if option:
        return option.group(1)
    group = re.search(r"Group '([\w.]+)' does not accept option '([\w.]+)'", message)
    if group:
        return f"{group.group(1)}.{group.group(2)}"
    return None


def _known_keys(parser: Any) -> list[str]:
    """Every settable key, nested ones included (model.attention.kind, trainer.max_steps, ...)."""
    try:
        return sorted(parser.get_defaults().keys())
    except Exception:  # a hint is optional: never let it hide the real error
        return []


def main(argv: Optional[Sequence[str]] = None) -> None:
    """The `train` command: parse the config, fit, print the final val loss and a sample."""
    args = _with_default_config(list(sys.argv[1:] if argv is None else argv))
    _quiet_lightning()
    if torch.cuda.is_available():
        torch.set_float32_matmul_precision("high")  # TF32 for the fp32 matmuls that remain
    cli = TrainCLI(args)
    model: MinitxLM = cli.model
    data: TextDataModule = cli.datamodule
    trainer: L.Trainer = cli.trainer
    run = _run_settings(cli.config_init["run"])
    ckpt_path = _resolve_ckpt_path(cli.config["ckpt_path"], run)
    _check_trainer(trainer)
    if ckpt_path is None and any(run.checkpoint_dir.glob("*.ckpt")):
        raise UserError(
            f"run.name: {str(run.dir)!r} already holds a run; resume it with --ckpt_path last, "
            "choose another --run.name, or delete that directory"
        )
    if ckpt_path is not None:
        check_resume_checkpoint(ckpt_path, model, data)
    # Every check of the input is done: only now does the run write anything.

    config_dump = yaml.safe_load(cli.parser.dump(cli.config, skip_validation=True))
    config_dump["ckpt_path"] = None  # the saved config starts a run; resuming is a flag
    model.train_config = config_dump
    model.tokenizer_dict = data.tokenizer.to_dict()
    sample_prompt = prompt_ids(run.sample_prompt, data.tokenizer, run.sample_prompt == RunSettings.sample_prompt)
    for logger in trainer.loggers:
        logger.log_hyperparams(config_dump)
    if trainer.is_global_zero:
        run.dir.mkdir(parents=True, exist_ok=True)
        (run.dir / "config.yaml").write_text(yaml.safe_dump(config_dump, sort_keys=False))
        n_params = model.model.num_params()
        print(f"minitx: {n_params / 1e6:.2f}M parameters, layers {model.config.layer_kinds}; data: {data.summary()}")
        print(f"minitx: run directory {run.dir}" + (f", resuming from {ckpt_path}" if ckpt_path else ""))
        peak = peak_flops(trainer.strategy.root_device)
        if peak is None:
            print(f"minitx: MFU unknown (no peak FLOP/s known for {_device_name(trainer.strategy.root_device)})")

    trainer.fit(model, datamodule=data, ckpt_path=ckpt_path, weights_only=True)

    if model.last_val is None or model.last_val[0] != trainer.global_step:
        trainer.validate(model, datamodule=data, verbose=False)
        model.last_val = (trainer.global_step, float(trainer.callback_metrics["val_loss"]))
    if trainer.is_global_zero:
        step, val_loss = model.last_val
        print(f"final val loss {val_loss:.4f} (perplexity {math.exp(val_loss):.2f}) at step {step}; checkpoints in {run.checkpoint_dir}")
        if run.sample_tokens > 0:
            text = sample_text(model.model, data.tokenizer, sample_prompt, run.sample_tokens, run.sample_temperature)
            print("sample:\n" + text)


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def _resolve_ckpt_path(value: Optional[str], run: RunSettings) -> Optional[str]:
    if value is None:
        return None
    if value in ("last", "best"):
        path = run.checkpoint_dir / (LAST if value == "last" else BEST)
        if not path.is_file():
            raise UserError(f"ckpt_path: {value!r} means {str(path)!r}, which does not exist; start the run without --ckpt_path or set run.name/run.root")
        return str(path)
    if Path(value).is_dir():
        raise UserError(f"ckpt_path: {value!r} is a directory; give the .ckpt file inside it (a run keeps them in checkpoints/), 'last' or 'best'")
    if not Path(value).is_file():
        raise UserError(f"ckpt_path: no checkpoint at {value!r}; give a .ckpt file, 'last' or 'best'")
    return value


def check_resume_checkpoint(path: str, model: MinitxLM, data: TextDataModule) -> None:
    """Refuse a checkpoint that this run cannot resume from, before the run writes anything.

    Lightning would find these only inside fit, after the run directory, its config.yaml and a
    new log version were written, and some (weights of other shapes, a weights-only file) only as
    a traceback. Read with weights_only=True like every load; fit reads the file again.
    """
    where = f"ckpt_path: {path!r}"
    checkpoint = read_checkpoint(path, where, "give last.ckpt or best.ckpt of a run")
    saved = checkpoint["minitx"]
    missing = [key for key in ("optimizer_states", "lr_schedulers", "loops", "global_step") if key not in checkpoint]
    if missing:
        raise UserError(
            f"{where} holds weights but no training state ({', '.join(missing)} missing), so training cannot resume "
            "from it; give last.ckpt of the run, or start a new run without --ckpt_path"
        )
    if saved.get("tokenizer") != data.tokenizer.to_dict():
        raise UserError(
            f"data.tokenizer: the checkpoint {path!r} was trained with another tokenizer or vocabulary "
            f"({_tokenizer_difference(saved.get('tokenizer'), data.tokenizer)}); resume with the data settings of the original run"
        )
    check_same_model(saved, model.config)
    mismatch = state_mismatch(model.state_dict(), checkpoint["state_dict"])
    if mismatch:
        raise UserError(f"{where}: its weights do not match its model config ({mismatch}); the file is damaged or was edited")


def check_same_model(saved: dict, config: ModelConfig) -> None:
    """A run resumes only into the model it saved: `saved` is a checkpoint's "minitx" entry."""
    if saved.get("model_config") != config.to_dict():
        diff = _dict_diff(saved.get("model_config") or {}, config.to_dict())
        raise UserError(f"ckpt_path: the checkpoint's model differs from the configured one ({diff}); resume with the same model settings")


def _tokenizer_difference(saved: Any, current: Any) -> str:
    """What differs between a checkpoint's tokenizer (its to_dict) and the data's, in a few words."""
    from .data.tokenizer import tokenizer_from_dict

    try:
        old = tokenizer_from_dict(saved)
    except Exception:
        return "the checkpoint's tokenizer cannot be rebuilt"
    if getattr(old, "chars", None) is not None and getattr(current, "chars", None) is not None:
        added = sorted(set(current.chars) - set(old.chars))
        dropped = sorted(set(old.chars) - set(current.chars))
        parts = [f"{len(old.chars)} characters then, {len(current.chars)} now"]
        if added:
            parts.append("new: " + " ".join(repr(ch) for ch in added[:10]) + (" ..." if len(added) > 10 else ""))
        if dropped:
            parts.append("gone: " + " ".join(repr(ch) for ch in dropped[:10]) + (" ..." if len(dropped) > 10 else ""))
        return ", ".join(parts)
    if old.vocab_size != current.vocab_size:
        return f"vocabulary of {old.vocab_size} tokens then, {current.vocab_size} now"
    return f"same size ({old.vocab_size} tokens), different tokens"


def _check_trainer(trainer: L.Trainer) -> None:
    if trainer.max_steps is None or trainer.max_steps < 1:
        raise UserError("trainer.max_steps: must be set (e.g. 5000); the training data never runs out, so runs are bounded in steps")
    accumulate = trainer.accumulate_grad_batches
    interval = trainer.val_check_interval
    if isinstance(interval, int) and interval % accumulate:
        raise UserError(
            f"trainer.val_check_interval: {interval} batches is not a multiple of "
            f"trainer.accumulate_grad_batches={accumulate}; validation must fall between optimiser steps"
        )
