"""The optimiser and its schedule.

Optimisers (model.optimizer): `adamw`, AdamW with weight decay on matrices only; `muon`,
torch.optim.Muon on the hidden matrices (muon_matrix) and AdamW on everything else, stepped
together as one MuonWithAdamW. Schedules (model.schedule), both after a linear warmup: `cosine`
decays to min_lr over the whole run; `wsd` (warmup-stable-decay) holds the peak lr and decays
only over the last steps (decay_steps, or decay_fraction of max_steps). The schedule multiplies
every parameter group's lr by the same factor, so Muon's lr follows AdamW's.
"""

from __future__ import annotations

import math
import re
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from ..errors import UserError

# MTA's key-query convolution and head-mixing matrices start as the identity. Weight decay pulls
# parameters towards zero, which for these means towards "no attention" rather than towards the
# plain attention they start from, so they are not decayed even though they are matrices.
NO_DECAY_NAMES = ("kq_conv", "kq_conv_post", "mix_pre", "mix_post")
# Prefixes wrappers put in parameter names (FSDP, activation checkpointing, torch.compile).
_WRAPPER_PREFIXES = re.compile(r"(_fsdp_wrapped_module\.|_checkpoint_wrapped_module\.|_orig_mod\.)")


def decays(name: str, param: Tensor) -> bool:
    """Weight decay on matrices (dim >= 2: linear weights, and embeddings as in nanoGPT), not on
    norms, biases, gates' biases or MTA's identity-initialised kernels."""
    return param.dim() >= 2 and name.rsplit(".", 1)[-1] not in NO_DECAY_NAMES


def optimizer_groups(
    named_params: Sequence[tuple[str, Tensor]], weight_decay: float, decay_names: set[str] | None = None
) -> list[dict]:
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


def muon_matrix(name: str, param: Tensor) -> bool:
    """Whether Muon updates this parameter (`name` without wrapper prefixes): the hidden matrices,
    i.e. the 2-D weights inside the blocks (attention and MLP projections). Muon's orthogonalised
    update suits a matrix that maps one hidden activation to another; the embeddings and the
    output head (tied to them by default) are lookups and readouts, and norms, biases, sinks,
    one-row gates and MTA's identity-initialised kernels (NO_DECAY_NAMES) are not such maps:
    they all stay on AdamW."""
    return (
        name.startswith("blocks.")
        and param.dim() == 2
        and min(param.shape) > 1
        and name.rsplit(".", 1)[-1] not in NO_DECAY_NAMES
    )


def split_for_muon(
    named_params: Sequence[tuple[str, Tensor]], muon_names: set[str]
) -> tuple[list[Tensor], list[tuple[str, Tensor]]]:
    """(Muon's parameters, the rest as (name, parameter)). `muon_names` are clean names decided
    on the unwrapped model, as for decay_names."""
    muon, rest = [], []
    for name, param in named_params:
        if not param.requires_grad:
            continue
        if _WRAPPER_PREFIXES.sub("", name) in muon_names:
            muon.append(param)
        else:
            rest.append((name, param))
    return muon, rest


def apply_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
    """Set every group's lr to the schedule's value at the scheduler's step. A checkpoint holds
    the lr its run computed; a run resumed with another max_steps (or decay) must take its first
    step at the lr of its own schedule, not the one it was saved with. An unchanged resume
    computes the same value, so exact resumption is kept."""
    lrs = [base * fn(scheduler.last_epoch) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, value in zip(scheduler.optimizer.param_groups, lrs):
        group["lr"] = value
    scheduler._last_lr = lrs


class _JointState(Mapping):
    """The per-parameter state of several optimisers, read as one (each parameter has one owner)."""

    def __init__(self, *optimizers: torch.optim.Optimizer):
        self.optimizers = optimizers

    def __getitem__(self, param: Tensor) -> dict:
        for optimizer in self.optimizers:
            if param in optimizer.state:  # a membership test: `state[param]` would add an entry
                return optimizer.state[param]
        raise KeyError(param)

    def __iter__(self) -> Iterator[Tensor]:
        for optimizer in self.optimizers:
            yield from optimizer.state

    def __len__(self) -> int:
        return sum(len(optimizer.state) for optimizer in self.optimizers)


def orthogonalise(
    updates: Tensor, coefficients: Sequence[float], steps: int, eps: float, precision: str = "auto"
) -> Tensor:
    """Newton-Schulz on a batch of same-shaped matrices (n, rows, columns), as torch.optim.Muon's
    on one: each scaled to Frobenius norm 1, then `steps` quintic iterations pushing its singular
    values towards 1. In the dtype `precision` names (muon_dtype): by default float32 on the CPU,
    where most CPUs have no native bfloat16 products, and bfloat16 elsewhere, as torch's.

    `updates` is scaled in place when it already has that dtype (BatchedMuon hands over a stack
    of its own)."""
    x = updates.to(muon_dtype(precision, updates.device))
    tall = x.size(-2) > x.size(-1)
    if tall:  # iterate on the smaller Gram matrix
        x = x.mT
    x.div_(x.norm(dim=(-2, -1), keepdim=True).clamp_(min=eps))
    x = newton_schulz(x, coefficients, steps)
    return x.mT if tall else x


def muon_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The dtype of Newton-Schulz's products for model.muon_precision: "auto" is float32 on a CPU
    and bfloat16 elsewhere; "bfloat16" everywhere is torch.optim.Muon's own choice, and on a CPU
    with native bfloat16 products (AVX512-BF16, AMX) about half float32's time (RESULTS)."""
    if precision == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return MUON_DTYPES[precision]


def newton_schulz(x: Tensor, coefficients: Sequence[float], steps: int) -> Tensor:
    """X' = a X + (b A + c A^2) X with A = X X^T, `steps` times, in buffers made once."""
    a, b, c = coefficients
    n, rows, columns = x.shape
    gram, poly = x.new_empty(n, rows, rows), x.new_empty(n, rows, rows)
    # x itself may be a transposed view; the iterates are contiguous, as baddbmm would make them.
    iterates = [x.new_empty(n, rows, columns), x.new_empty(n, rows, columns)]
    for step in range(steps):
        torch.bmm(x, x.mT, out=gram)
        torch.baddbmm(gram, gram, gram, beta=b, alpha=c, out=poly)  # b A + c A^2
        x = torch.baddbmm(x, poly, x, beta=a, out=iterates[step % 2])  # a X + (b A + c A^2) X
    return x


def muon_lr_scale(shape: Sequence[int], adjust_lr_fn: str | None) -> float:
    """torch.optim.Muon's lr multiplier for a matrix of `shape` (its adjust_lr_fn)."""
    rows, columns = shape[:2]
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, columns))
    return math.sqrt(max(1, rows / columns))


class BatchedMuon(torch.optim.Muon):
    """torch.optim.Muon (same settings, same state: a momentum buffer per matrix) whose
    Newton-Schulz runs once per shape on the stacked matrices of that shape, rather than once
    per matrix, in float32 on the CPU (orthogonalise). The default model's 16 matrices come in 4
    shapes; benchmarks/optimizers.py times this step against torch's.

    The arithmetic around the iteration is one call per group or shape where torch has one
    (torch._foreach_*), and the Nesterov update is written straight into the stack that
    orthogonalise scales in place: each step's numbers are those of the loop per matrix.

    `precision`: the dtype of Newton-Schulz's products (muon_dtype), a setting, not state."""

    def __init__(self, params, *args, precision: str = "auto", **kwargs):
        super().__init__(params, *args, **kwargs)
        self.precision = precision

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [param for param in group["params"] if param.grad is not None]
            if params:
                self._step_group(group, params)
        return loss

    def _step_group(self, group: dict, params: list[Tensor]) -> None:
        momentum, lr, decay = group["momentum"], group["lr"], group["weight_decay"]
        # Under FSDP2 a parameter, its gradient and its buffer are DTensors holding this process's
        # rows: the elementwise arithmetic runs on those rows (local), Newton-Schulz on the whole
        # matrix (whole_updates, then own_rows). Plain tensors pass through both unchanged.
        grads = [local(param.grad) for param in params]
        buffers = []
        for param in params:
            state = self.state[param]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(param.grad)
            buffers.append(local(state["momentum_buffer"]))
        weights = [local(param) for param in params]
        torch._foreach_lerp_(buffers, grads, 1 - momentum)  # buffer = m buffer + (1 - m) grad
        if decay:  # decoupled, before the update, as torch's
            torch._foreach_mul_(weights, 1 - lr * decay)

        by_shape: dict[tuple, list[int]] = defaultdict(list)
        for i, param in enumerate(params):
            by_shape[tuple(param.shape)].append(i)  # a DTensor's shape is the whole matrix's
        for shape, members in by_shape.items():
            stack = grads[members[0]].new_empty((len(members), *grads[members[0]].shape))
            for row, i in enumerate(members):
                if group["nesterov"]:  # grad + m (buffer - grad), into its row of the stack
                    torch.lerp(grads[i], buffers[i], momentum, out=stack[row])
                else:
                    stack[row].copy_(buffers[i])
            like = params[members[0]]
            whole = self.whole_updates(stack, like)
            ortho = orthogonalise(
                whole, group["ns_coefficients"], group["ns_steps"], group["eps"], self.precision
            )
            ortho = self.own_rows(ortho, like)
            scale = muon_lr_scale(shape, group["adjust_lr_fn"])
            matrices = [matrix.to(weights[i].dtype) for i, matrix in zip(members, ortho)]
            torch._foreach_add_([weights[i] for i in members], matrices, alpha=-lr * scale)

    # Distributed Muon (Moonlight's): each process gathers the whole updates of a shape, runs
    # Newton-Schulz on them, and keeps its own rows. Orthogonalising only the local rows would
    # be another update altogether (the rows of a whole matrix's polar factor are not the polar
    # factor of those rows); tests/training/test_fsdp2.py shows that variant drift.
    @staticmethod
    def whole_updates(stack: Tensor, like: Tensor) -> Tensor:
        """The (n, rows, columns) updates whose local parts `stack` holds, gathered from every
        process when the parameters (`like`, one of them) are DTensors."""
        if not is_dtensor(like):
            return stack
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(
            stack,
            like.device_mesh,
            stacked_placements(like.placements),
            shape=torch.Size((stack.size(0), *like.shape)),
            stride=contiguous_stride((stack.size(0), *like.shape)),
        ).full_tensor()

    @staticmethod
    def own_rows(whole: Tensor, like: Tensor) -> Tensor:
        """This process's part of the whole (n, rows, columns) `whole`, placed as `like`'s
        (no communication: every process holds `whole`)."""
        if not is_dtensor(like):
            return whole
        from torch.distributed.tensor import distribute_tensor

        placements = stacked_placements(like.placements)
        return distribute_tensor(whole, like.device_mesh, placements, src_data_rank=None).to_local()


def is_dtensor(tensor: Tensor) -> bool:
    """Whether `tensor` is a DTensor (FSDP2's parameters). Without torch.distributed.tensor
    imported there is none: not importing it keeps the commands' start (the precheck) fast."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def local(tensor: Tensor) -> Tensor:
    """A DTensor's local part (the same storage: updating it updates the DTensor), or `tensor`."""
    return tensor.to_local() if is_dtensor(tensor) else tensor


def stacked_placements(placements: Sequence[Any]) -> list[Any]:
    """A matrix's placements for a stack of such matrices: a sharded dimension moves up by one."""
    from torch.distributed.tensor import Shard

    return [Shard(p.dim + 1) if isinstance(p, Shard) else p for p in placements]


def contiguous_stride(shape: Sequence[int]) -> tuple[int, ...]:
    stride, running = [], 1
    for size in reversed(shape):
        stride.append(running)
        running *= size
    return tuple(reversed(stride))


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon (BatchedMuon) on the hidden matrices and torch.optim.AdamW on the rest, as one optimiser.

    Lightning's automatic optimisation steps one optimiser, so the pair is one: `param_groups`
    are AdamW's groups then Muon's (the same dicts, so the LR scheduler and gradient clipping,
    which go through param_groups, act on both; param_groups[0] is AdamW's, the lr logged),
    step() steps both, and state_dict() holds both optimisers' states, plain tensors and
    containers, for exact resumption.
    """

    def __init__(
        self,
        muon_params: list[Tensor],
        adamw_groups: list[dict],
        *,
        muon_lr: float,
        muon_momentum: float,
        muon_weight_decay: float,
        muon_precision: str,
        lr: float,
        betas: Sequence[float],
        eps: float,
        fused: bool = False,
    ):
        self.adamw = torch.optim.AdamW(adamw_groups, lr=lr, betas=tuple(betas), eps=eps, fused=fused)
        self.muon = BatchedMuon(
            muon_params,
            lr=muon_lr,
            momentum=muon_momentum,
            weight_decay=muon_weight_decay,
            precision=muon_precision,
        )
        # Optimizer.__init__ adds the given group dicts themselves (no copies): ours are the two
        # optimisers' own, so a change of lr through either view is seen by both.
        super().__init__(self.adamw.param_groups + self.muon.param_groups, defaults={})
        self.state = _JointState(self.adamw, self.muon)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.adamw.step()
        self.muon.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.adamw.zero_grad(set_to_none)
        self.muon.zero_grad(set_to_none)

    def state_dict(self) -> dict:
        return {"adamw": self.adamw.state_dict(), "muon": self.muon.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        self.adamw.load_state_dict(state_dict["adamw"])
        self.muon.load_state_dict(state_dict["muon"])
        # load_state_dict replaces each optimiser's group dicts: point at the new ones.
        self.param_groups = self.adamw.param_groups + self.muon.param_groups


@dataclass(frozen=True)
class Parameters:
    """What an optimiser is built over: the model's named parameters and the decisions made on the
    unwrapped model (`decays`, `muon_matrix`), as clean names, since wrappers rename and flatten."""

    named: list[tuple[str, Tensor]]
    decay_names: set[str]
    muon_names: set[str]
    fused: bool = False  # torch's fused AdamW kernel (CUDA)


def build_adamw(settings: Optimisation, params: Parameters) -> torch.optim.Optimizer:
    groups = optimizer_groups(params.named, settings.weight_decay, params.decay_names)
    return torch.optim.AdamW(
        groups, lr=settings.lr, betas=tuple(settings.betas), eps=settings.eps, fused=params.fused
    )


def build_muon(settings: Optimisation, params: Parameters) -> torch.optim.Optimizer:
    muon, rest = split_for_muon(params.named, params.muon_names)
    if any(p.dim() != 2 for p in muon):
        raise UserError(
            "model.optimizer: muon needs each hidden matrix as a matrix, but the strategy flattened the "
            "parameters (FSDP1's `fsdp`); shard with --trainer.strategy fsdp2, or use ddp"
        )
    return MuonWithAdamW(
        muon,
        optimizer_groups(rest, settings.weight_decay, params.decay_names),
        muon_lr=settings.muon_lr,
        muon_momentum=settings.muon_momentum,
        muon_weight_decay=settings.muon_weight_decay,
        muon_precision=settings.muon_precision,
        lr=settings.lr,
        betas=settings.betas,
        eps=settings.eps,
        fused=params.fused,
    )


@dataclass(frozen=True)
class OptimiserSpec:
    """One value of model.optimizer: how it is built, and how its saved state is told apart (a
    run resumes with the optimiser whose state its checkpoint holds, whatever the config says)."""

    build: Callable[[Optimisation, Parameters], torch.optim.Optimizer]
    saved: Callable[[dict], bool]  # whether an optimiser's state_dict() is this one's


# Adding an optimiser is one entry here, plus its settings (if any) in Optimisation. AdamW is
# recognised last: a state no other optimiser claims is AdamW's, as every older checkpoint's.
OPTIMIZERS: dict[str, OptimiserSpec] = {
    "muon": OptimiserSpec(build_muon, lambda state: set(state) == {"adamw", "muon"}),
    "adamw": OptimiserSpec(build_adamw, lambda state: True),
}
SCHEDULES = ("cosine", "wsd")
DECAY_SHAPES = ("linear", "1-sqrt")
MUON_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MUON_PRECISIONS = ("auto", *MUON_DTYPES)


@dataclass(frozen=True)
class Optimisation:
    """The optimiser and schedule settings, the model.* keys of a config (`model.lr`, ...), with
    their checks: the one declaration that MinitxLM, its schedule and the resume checks read.

    Args:
        lr: AdamW's peak learning rate (the schedule scales Muon's muon_lr by the same factor).
        min_lr: final learning rate of the schedule.
        warmup_steps: optimiser steps of linear warmup.
        weight_decay: AdamW decay on matrices only (see minitx.training.optim.decays).
        betas: AdamW's betas.
        eps: AdamW's eps.
        optimizer: "adamw" for every parameter, or "muon": torch.optim.Muon on the hidden matrices
            (minitx.training.optim.muon_matrix) and AdamW on the rest.
        muon_lr: Muon's peak learning rate.
        muon_momentum: Muon's (Nesterov) momentum.
        muon_weight_decay: Muon's decoupled weight decay (multiplied by its lr, as AdamW's).
        muon_precision: the dtype of Muon's Newton-Schulz products: "auto" (float32 on a CPU,
            bfloat16 on a GPU), "float32" or "bfloat16" (torch.optim.Muon's everywhere; on a CPU
            with native bfloat16 products, about half float32's time).
        schedule: after the warmup, "cosine" down to min_lr over the run, or "wsd": lr held,
            then down to min_lr over the last decay_steps (or decay_fraction of max_steps).
        decay_steps: wsd's decay in steps; when unset, decay_fraction * max_steps.
        decay_fraction: wsd's decay as a fraction of max_steps (0 holds lr to the end).
        decay_shape: wsd's decay, "linear" or "1-sqrt" (lr - (lr - min_lr) * sqrt(progress)).
    """

    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    # The settings below came later. A checkpoint or config without them ran with these values,
    # so they are also what an older run resumes with (ADDED_LATER): change them only with a
    # mapping for older runs.
    optimizer: str = "adamw"
    muon_lr: float = 0.02
    muon_momentum: float = 0.95
    muon_weight_decay: float = 0.0
    schedule: str = "cosine"
    decay_steps: int | None = None
    decay_fraction: float = 0.2
    decay_shape: str = "linear"
    muon_precision: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))  # a config gives a list
        self.check()

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> Optimisation:
        """The settings among `settings` (a config's model section, a module's hparams: other keys
        are ignored); one it lacks, from an older run, takes its default."""
        return cls(**{name: settings[name] for name in cls.names() if name in settings})

    def check(self, prefix: str = "model") -> None:
        """Each setting's check; errors name `<prefix>.<setting>` and say the fix."""

        def fail(name: str, fix: str) -> None:
            value = getattr(self, name)
            shown = (
                repr(value) if isinstance(value, str) else list(value) if isinstance(value, tuple) else value
            )
            raise UserError(f"{prefix}.{name}: is {shown}; {fix}")

        if not self.lr > 0:
            fail("lr", "use a positive learning rate such as 1e-3")
        if not 0 <= self.min_lr <= self.lr:
            fail("min_lr", f"use a value between 0 and {prefix}.lr={self.lr}")
        if self.warmup_steps < 0:
            fail("warmup_steps", "use 0 or more")
        if self.weight_decay < 0:
            fail("weight_decay", "use 0 or more")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            fail("betas", "use two numbers in [0, 1), e.g. [0.9, 0.95]")
        if not (self.eps > 0 and math.isfinite(self.eps)):
            fail("eps", "use a small positive number such as 1e-8")
        if self.optimizer not in OPTIMIZERS:
            fail("optimizer", f"use one of {', '.join(sorted(OPTIMIZERS))}")
        if not self.muon_lr > 0:
            fail("muon_lr", "use a positive learning rate such as 0.02")
        if not 0 <= self.muon_momentum < 1:
            fail("muon_momentum", "use a number in [0, 1), e.g. 0.95")
        if self.muon_weight_decay < 0:
            fail("muon_weight_decay", "use 0 or more")
        if self.schedule not in SCHEDULES:
            fail("schedule", f"use one of {', '.join(SCHEDULES)}")
        if self.decay_steps is not None and self.decay_steps < 0:
            fail("decay_steps", f"use 0 or more, or leave it unset to use {prefix}.decay_fraction")
        if not 0 <= self.decay_fraction <= 1:
            fail("decay_fraction", "use a fraction of max_steps in [0, 1], e.g. 0.2")
        if self.decay_shape not in DECAY_SHAPES:
            fail("decay_shape", f"use one of {', '.join(DECAY_SHAPES)}")
        if self.muon_precision not in MUON_PRECISIONS:
            fail("muon_precision", f"use one of {', '.join(MUON_PRECISIONS)}")

    def lr_at(self, step: int, max_steps: int) -> float:
        """The peak lr's value at optimiser step `step` of a run of `max_steps` (see lr_at)."""
        return lr_at(
            step,
            self.lr,
            self.min_lr,
            self.warmup_steps,
            max_steps,
            schedule=self.schedule,
            decay_steps=self.decay_steps,
            decay_fraction=self.decay_fraction,
            decay_shape=self.decay_shape,
        )

    def configure(self, params: Parameters, max_steps: int) -> dict:
        """The optimiser over `params` and a LambdaLR stepped every optimiser step, as
        configure_optimizers returns them. Every group's lr is its initial lr times
        lr_at(step) / lr, so AdamW's and Muon's groups move by the same factor."""
        optimizer = OPTIMIZERS[self.optimizer].build(self, params)

        def factor(step: int) -> float:  # a plain function: LambdaLR saves no state of it
            return self.lr_at(step, max_steps) / self.lr

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1},
        }


DEFAULTS = Optimisation()
# Settings a checkpoint of an older minitx may lack: it ran with their defaults.
ADDED_LATER = Optimisation.names()[Optimisation.names().index("optimizer") :]


def optimizer_of_state(state: Mapping | None) -> str:
    """The model.optimizer whose state_dict() `state` is (the first that claims it)."""
    if isinstance(state, Mapping):
        for name, spec in OPTIMIZERS.items():
            if spec.saved(state):
                return name
    return DEFAULTS.optimizer  # no state at all: a checkpoint of an older minitx, AdamW's


def lr_at(
    step: int,
    lr: float,
    min_lr: float,
    warmup_steps: int,
    max_steps: int,
    schedule: str = DEFAULTS.schedule,
    decay_steps: int | None = DEFAULTS.decay_steps,
    decay_fraction: float = DEFAULTS.decay_fraction,
    decay_shape: str = DEFAULTS.decay_shape,
) -> float:
    """The learning rate of optimiser step `step`: linear warmup from lr/warmup_steps to lr over
    `warmup_steps`, then to `min_lr` at `max_steps` (and min_lr after that), by

    - "cosine": a cosine over all steps after the warmup;
    - "wsd" (warmup-stable-decay): lr until the last `decay_steps` steps (or the last
      `decay_fraction` of max_steps when decay_steps is None), then down to min_lr, in a straight
      line ("linear") or as 1 - sqrt(progress) ("1-sqrt", which drops faster at the start).

    The stages follow from max_steps as given, so a wsd run resumed with a larger max_steps stays
    at lr until its new decay starts: the schedule is a function, never state in a checkpoint.
    """
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr
    if schedule == "cosine":
        progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)
    decay = decay_steps if decay_steps is not None else round(decay_fraction * max_steps)
    start = max(warmup_steps, max_steps - decay)  # a decay longer than the run starts after warmup
    if step < start:
        return lr
    progress = (step - start) / max(1, max_steps - start)
    drop = progress if decay_shape == "linear" else math.sqrt(progress)
    return lr - drop * (lr - min_lr)
