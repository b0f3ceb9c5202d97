"""A short MinitxLM run on fixed batches, in one process or sharded with FSDP2, for
tests/training/test_fsdp2.py: it writes the global loss of every step (the mean over ranks), and
the state rank 0 saved, to --out as JSON.

Every step's global batch is the same 8 sequences whatever the number of processes: one process
takes all 8, two take rows 0, 2, 4, 6 and 1, 3, 5, 7 (RankRows), so the
mean gradient, and with it every step, is the same up to rounding.

    python tests/training/sharded_run.py --out one.json
    python tests/training/sharded_run.py --devices 2 --out two.json
    python tests/training/sharded_run.py --devices 2 --optimizer muon --local-muon --out wrong.json

--local-muon runs the wrong Muon on purpose: Newton-Schulz on each process's rows alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from minitx.training.module import MinitxLM  # noqa: E402
from minitx.training.optim import BatchedMuon  # noqa: E402
from minitx.training.run import AtomicCheckpointIO  # noqa: E402

VOCAB, T, GLOBAL_BATCH = 64, 16, 8


def batches(steps: int) -> TensorDataset:
    """Sequences of a fixed random walk over the vocabulary: learnable, the same in every process."""
    g = torch.Generator().manual_seed(0)
    table = torch.randint(0, VOCAB, (VOCAB, 3), generator=g)
    n = steps * GLOBAL_BATCH
    seq = torch.empty(n, T + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
    for t in range(T):
        seq[:, t + 1] = table[seq[:, t], torch.randint(0, 3, (n,), generator=g)]
    return TensorDataset(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())


class RankRows(torch.utils.data.Sampler):
    """Rows rank, rank + world, ... of the dataset, in order (Lightning's own DistributedSampler
    would shuffle them)."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        dist = torch.distributed
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        return iter(range(rank, self.n, world))

    def __len__(self) -> int:
        return self.n


class Record(L.Callback):
    """The global loss of every optimiser step; a checkpoint at --save-at."""

    def __init__(self, save_at: int | None, save_path: str | None):
        self.losses: list[float] = []
        self.save_at, self.save_path = save_at, save_path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = trainer.strategy.reduce(outputs["loss"].detach(), reduce_op="mean")
        self.losses.append(float(loss))
        if self.save_at is not None and trainer.global_step == self.save_at:
            trainer.save_checkpoint(self.save_path)


def local_shard_only() -> None:
    """The wrong Distributed Muon: each process orthogonalises its own rows of each update."""
    BatchedMuon.whole_updates = staticmethod(lambda stack, like: stack)
    BatchedMuon.own_rows = staticmethod(lambda whole, like: whole)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--optimizer", default="adamw")
    parser.add_argument("--muon-precision", default="float32")
    parser.add_argument("--kind", default="mha")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--local-muon", action="store_true")
    parser.add_argument("--save-at", type=int)
    parser.add_argument("--save-path")
    parser.add_argument("--resume")
    args = parser.parse_args()
    if args.local_muon:
        local_shard_only()
    torch.manual_seed(0)
    model = MinitxLM(
        vocab_size=VOCAB,
        block_size=T,
        n_layer=2,
        n_head=2,
        d_model=32,
        dropout=0.0,
        attention={"kind": args.kind},
        optimizer=args.optimizer,
        optimizer_options={"muon": {"precision": args.muon_precision}},
        lr=3e-3,
        min_lr=3e-4,
        warmup_steps=3,
        max_steps=args.steps,
    )
    # The format check on load wants a minitx checkpoint's entry: saved as train.py does.
    model.tokenizer_dict, model.train_config = None, None
    world = args.devices * args.num_nodes
    data = batches(args.steps)
    loader = DataLoader(data, batch_size=GLOBAL_BATCH // world, sampler=RankRows(len(data)))
    record = Record(args.save_at, args.save_path)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy="fsdp2" if world > 1 else "auto",
        precision="32-true",
        max_steps=args.steps,
        gradient_clip_val=1.0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[record],
        use_distributed_sampler=False,
        plugins=[AtomicCheckpointIO()],
        default_root_dir=str(Path(args.out).parent),
    )
    trainer.fit(model, train_dataloaders=loader, ckpt_path=args.resume, weights_only=True)
    if trainer.is_global_zero:
        Path(args.out).write_text(json.dumps({"losses": record.losses, "rank": os.environ.get("NODE_RANK")}))


if __name__ == "__main__":
    main()
