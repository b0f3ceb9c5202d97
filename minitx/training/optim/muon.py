"""Muon: torch.optim.Muon on the hidden matrices (muon_matrix) and AdamW on everything else,
stepped together as one optimiser (MuonWithAdamW); model.optimizer muon.

Its settings (model.optimizer_options.muon.*: MuonSettings), how it is built (build_muon), how
its saved state is recognised (is_muon_state) and split into plain torch optimisers'
(muon_state_parts); its entry in registry.py puts them together with which of its settings are
learning rates. Newton-Schulz runs once per shape on the stacked matrices of that shape
(BatchedMuon) and, under FSDP2, on whole matrices gathered from every process.
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

import torch
from torch import Tensor

from ...errors import UserError
from ...options import OptionError
from .adamw import adamw
from .groups import NO_DECAY_NAMES, Parameters, clean_name, decays, optimizer_groups

MUON_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MuonPrecision = Literal["auto", "float32", "bfloat16"]  # "auto", or a key of MUON_DTYPES
MUON_PRECISIONS = get_args(MuonPrecision)


@dataclass(frozen=True)
class MuonSettings:
    """Muon's settings, model.optimizer_options.muon.* (read when model.optimizer is muon).

    Args:
        lr: Muon's peak learning rate (the schedule scales it by the same factor as model.lr).
        momentum: Muon's (Nesterov) momentum.
        weight_decay: Muon's decoupled weight decay (multiplied by its lr, as AdamW's).
        precision: the dtype of Muon's Newton-Schulz products: "auto" (float32 on a CPU,
            bfloat16 on a GPU), "float32" or "bfloat16" (torch.optim.Muon's everywhere; on a CPU
            with native bfloat16 products, about half float32's time).
    """

    # Later than the first optimiser settings: a checkpoint or config without them ran with these
    # values, so they are also what an older run resumes with (settings.ADDED_LATER).
    lr: float = 0.02
    momentum: float = 0.95
    weight_decay: float = 0.0
    precision: MuonPrecision = "auto"

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise OptionError("lr", f"is {self.lr}", "use a positive learning rate such as 0.02")
        if not 0 <= self.momentum < 1:
            raise OptionError("momentum", f"is {self.momentum}", "use a number in [0, 1), e.g. 0.95")
        if self.weight_decay < 0:
            raise OptionError("weight_decay", f"is {self.weight_decay}", "use 0 or more")


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
    trained = [(name, param) for name, param in named_params if param.requires_grad]
    muon = [param for name, param in trained if clean_name(name) in muon_names]
    return muon, [(name, param) for name, param in trained if clean_name(name) not in muon_names]


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
    """The dtype of Newton-Schulz's products for model.optimizer_options.muon.precision: "auto" is
    float32 on a CPU and bfloat16 elsewhere; "bfloat16" everywhere is torch.optim.Muon's own
    choice, and on a CPU with native bfloat16 products (AVX512-BF16, AMX) about half float32's
    time (RESULTS)."""
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
        loss = closure_loss(closure)
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

        shape = torch.Size((stack.size(0), *like.shape))
        stride = torch.empty(shape, device="meta").stride()  # a contiguous stack's
        placements = stacked_placements(like.placements)
        return DTensor.from_local(
            stack, like.device_mesh, placements, shape=shape, stride=stride
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


def closure_loss(closure: Callable[[], Any] | None) -> Any:
    """What a step's closure returns, evaluated with gradients on, as torch's optimisers do; None
    without one."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


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


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon (BatchedMuon) on the hidden matrices and torch.optim.AdamW on the rest, as one optimiser.

    Lightning's automatic optimisation steps one optimiser, so the pair is one: `param_groups`
    are AdamW's groups then Muon's (the same dicts, so the LR scheduler and gradient clipping,
    which go through param_groups, act on both; param_groups[0] is AdamW's, the lr logged),
    step() steps both, and state_dict() holds both optimisers' states, plain tensors and
    containers, for exact resumption.
    """

    def __init__(
        self, muon_params: list[Tensor], adamw_groups: list[dict], settings: Any, fused: bool = False
    ):
        # `settings`: an Optimisation, its shared settings AdamW's, optimizer_options.muon (a
        # MuonSettings, whose fields are BatchedMuon's keywords) Muon's.
        self.adamw = adamw(adamw_groups, settings, fused)
        self.muon = BatchedMuon(muon_params, **asdict(settings.optimizer_options.muon))
        # Optimizer.__init__ adds the given group dicts themselves (no copies): ours are the two
        # optimisers' own, so a change of lr through either view is seen by both.
        super().__init__(self.adamw.param_groups + self.muon.param_groups, defaults={})
        self.state = _JointState(self.adamw, self.muon)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
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


def build_muon(settings: Any, params: Parameters) -> torch.optim.Optimizer:
    """MuonWithAdamW from `settings` (an Optimisation: the shared settings, and Muon's own under
    optimizer_options.muon)."""
    muon, rest = split_for_muon(params.named, params.chosen(muon_matrix))
    if any(p.dim() != 2 for p in muon):
        raise UserError(
            "model.optimizer: muon needs each hidden matrix as a matrix, but the strategy flattened the "
            "parameters (FSDP1's `fsdp`); shard with --trainer.strategy fsdp2, or use ddp"
        )
    groups = optimizer_groups(rest, settings.weight_decay, params.chosen(decays))
    return MuonWithAdamW(muon, groups, settings, fused=params.fused)


def muon_state_parts(optimizer: MuonWithAdamW) -> dict[str, torch.optim.Optimizer]:
    """The two plain torch optimisers whose state_dicts MuonWithAdamW's holds, by key."""
    return {"adamw": optimizer.adamw, "muon": optimizer.muon}


def is_muon_state(state: Mapping) -> bool:
    """Whether an optimiser's state_dict() is MuonWithAdamW's."""
    return set(state) == {"adamw", "muon"}
