"""One run sharded over processes with FSDP2: `--trainer.strategy fsdp2`.

Every process holds 1/N of each parameter, gradient and optimiser state (N = nodes x devices,
all data-parallel); a block's weights are gathered whole just before it runs and freed after.
Groups (`shard_transformer`): one per block, and the root (token embedding, the output layer
tied to it, the final norm), so a tied matrix is one parameter in one group. Inside a block's
forward and backward its weights are plain whole tensors, so every attention kind's custom
operators (MTA's C loops and torch.library ops, gdn's chunked scan, Triton kernels) see what they
see in one process. Muon orthogonalises whole matrices under it (optim.BatchedMuon).

Checkpoints are consolidated: rank 0 writes the usual single `last.ckpt`, the same file as a
one-process run's (whole weights, whole optimiser state with every entry, under the same keys),
so generate.py, export.py and evaluate.py read it as they read any other, a one-process run can
resume it, and a sharded run can resume a one-process checkpoint. Loading gives each process its
rows of every tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry
from torch import Tensor
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from ..files.checkpoint import load_file
from ..model import Transformer
from .optim.registry import state_parts

STRATEGY_NAME = "fsdp2"


class FSDP2Strategy(ModelParallelStrategy):
    """Lightning's ModelParallelStrategy with every process data-parallel (tensor_parallel_size=1,
    data_parallel_size = nodes x devices) and consolidated single-file checkpoints. The sharding
    itself is MinitxLM.configure_model's (shard_transformer)."""

    def __init__(self, **kwargs: Any):
        super().__init__(
            data_parallel_size="auto", tensor_parallel_size=1, save_distributed_checkpoint=False, **kwargs
        )

    def setup_environment(self) -> None:
        # ModelParallelStrategy's "auto" data-parallel size is the number of nodes (its devices
        # within a node go to tensor parallelism): here every process is a data-parallel rank.
        self._data_parallel_size = self.num_nodes * self.num_processes
        self._tensor_parallel_size = 1
        super().setup_environment()

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimiser's own state_dict() with every DTensor gathered whole (all ranks take
        part; rank 0 keeps it): the format of a one-process run, with all its entries. (torch's
        get_optimizer_state_dict re-keys by parameter name and does not know an optimiser made
        of several, as Muon's.)"""
        optimizer = optimizer._optimizer if isinstance(optimizer, LightningOptimizer) else optimizer
        state = whole_tensors(optimizer.state_dict())
        return state if self.global_rank == 0 else {}

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """A single-file checkpoint (this strategy's, or a one-process run's) read on every
        rank, each keeping its rows of the weights and of the optimiser state."""
        path = Path(self.broadcast(checkpoint_path))
        checkpoint = load_file(
            path, f"ckpt_path: {str(path)!r}", "give last.ckpt or best.ckpt written by train.py", "cpu"
        )
        options = StateDictOptions(full_state_dict=True, strict=self.lightning_module.strict_loading)
        set_model_state_dict(self.model, checkpoint["state_dict"], options=options)
        for optimizer, state in zip(self.optimizers, checkpoint.get("optimizer_states", [])):
            optimizer.load_state_dict(placed_like(state, optimizer))
        return checkpoint


StrategyRegistry.register(
    STRATEGY_NAME,
    FSDP2Strategy,
    description="FSDP2 (fully_shard per block), every process data-parallel, single-file checkpoints",
    override=True,  # this module may be imported again under another name (a test's subprocess)
)


def shard_transformer(model: Transformer, mesh: Any, bf16: bool = False) -> None:
    """fully_shard each block, then the root (embedding, tied output layer, final norm) over
    the 1-D data-parallel `mesh`. `bf16`: the gathered weights are bfloat16 for the forward and
    backward, the gradients reduced in float32 and the sharded weights kept in float32."""
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if bf16
        else MixedPrecisionPolicy()
    )
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def is_sharded(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def whole_model(lm: Any) -> Transformer | None:
    """The LightningModule's Transformer with whole weights: itself in one process; under FSDP2
    a plain copy on rank 0 (None on the others), gathered with every rank taking part."""
    if not is_sharded(lm.model):
        return lm.model
    state = get_model_state_dict(lm.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if lm.global_rank != 0:
        return None
    model = Transformer(lm.config)
    model.load_state_dict(state)
    return model.to(lm.device).eval()


def whole_tensors(value: Any) -> Any:
    """`value` (nested dicts and lists) with each DTensor gathered into a whole tensor on the
    CPU. Every rank walks the same structure in the same order, so the gathers pair up."""
    if isinstance(value, DTensor):
        return value.full_tensor().cpu()
    if isinstance(value, Mapping):
        return {key: whole_tensors(item) for key, item in value.items()}
    if isinstance(value, list):
        return [whole_tensors(item) for item in value]
    return value


def placed_like(state: dict, optimizer: torch.optim.Optimizer) -> dict:
    """A saved optimiser state_dict whose per-parameter tensors are whole, with each tensor of a
    DTensor parameter's shape turned into a DTensor placed as that parameter (this rank's rows)."""
    optimizer = optimizer._optimizer if isinstance(optimizer, LightningOptimizer) else optimizer
    parts = state_parts(optimizer, state)  # an optimiser of several (Muon's: registry.py)
    if parts is not None:
        return {key: placed_like(state[key], part) for key, part in parts.items()}
    params = {}
    for saved, group in zip(state["param_groups"], optimizer.param_groups):
        params.update(zip(saved["params"], group["params"]))
    placed = {
        index: {name: _placed(value, params.get(index)) for name, value in entry.items()}
        for index, entry in state["state"].items()
    }
    return {**state, "state": placed}


def _placed(value: Any, param: Tensor | None) -> Any:
    if not (isinstance(param, DTensor) and isinstance(value, Tensor) and value.shape == param.shape):
        return value
    whole = value.to(device=param.device, dtype=param.dtype)
    # Every rank holds the whole tensor: each keeps its rows, no communication.
    return distribute_tensor(whole, param.device_mesh, param.placements, src_data_rank=None)
