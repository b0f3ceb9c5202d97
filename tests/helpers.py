"""Helpers shared by test modules in several folders (training runs, tokenizers, exports)."""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path


def metrics(run: Path, version: int = 0) -> tuple[dict[int, float], dict[int, float]]:
    """(train loss by step, val loss by step) from a run's CSV log."""
    with open(run / "logs" / f"version_{version}" / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    train_loss = {int(r["step"]): float(r["train_loss"]) for r in rows if r.get("train_loss")}
    val_loss = {int(r["step"]): float(r["val_loss"]) for r in rows if r.get("val_loss")}
    return train_loss, val_loss


def bpe_tokenizer():
    """A small byte-level BPE over accented text: tokens that end inside a character."""
    from minitx.data.tokenizer import train_bpe

    return train_bpe("héllo wörld, ça va? ✓ naïve café " * 20, vocab_size=270)


def export_model(tmp_path: Path, model, tokenizer, name: str = "hf") -> Path:
    """Export a minitx model through a checkpoint in the training format; returns the directory."""
    import torch

    from minitx.hf.export import export_checkpoint

    checkpoint = tmp_path / f"{name}.ckpt"
    torch.save(
        {
            "state_dict": {f"model.{key}": value for key, value in model.state_dict().items()},
            "minitx": {"format": 1, "model_config": model.config.to_dict(), "tokenizer": tokenizer.to_dict()},
        },
        checkpoint,
    )
    export_checkpoint(str(checkpoint), str(tmp_path / name), log=lambda _: None)
    return tmp_path / name


def load_quietly(directory: Path):
    """transformers' model of an exported directory (native classes only), without its chatter."""
    import transformers

    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    finally:
        transformers.logging.set_verbosity(level)
        transformers.utils.logging.enable_progress_bar()


def assert_figures_close(ours, theirs, rel: float, what: str = "figure") -> None:
    """Equal structure, None exactly where the other has None (a statistic with no meaning, such as
    a gdn layer's entropy), and numbers within `rel`. Written out rather than left to
    pytest.approx, whose handling of None differs between releases (9.2 raises on it)."""
    if isinstance(ours, (list, tuple)) or isinstance(theirs, (list, tuple)):
        assert isinstance(ours, (list, tuple)) and isinstance(theirs, (list, tuple)), (what, ours, theirs)
        assert len(ours) == len(theirs), (what, ours, theirs)
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_figures_close(a, b, rel, f"{what}[{i}]")
    elif isinstance(ours, dict) or isinstance(theirs, dict):
        assert isinstance(ours, dict) and isinstance(theirs, dict) and ours.keys() == theirs.keys(), (
            what,
            ours,
            theirs,
        )
        for key in ours:
            assert_figures_close(ours[key], theirs[key], rel, f"{what}[{key!r}]")
    elif ours is None or theirs is None:
        assert ours is None and theirs is None, (
            f"{what}: {ours!r} against {theirs!r} (None only where both have no value)"
        )
    else:
        assert math.isclose(float(ours), float(theirs), rel_tol=rel, abs_tol=1e-12), (
            f"{what}: {ours!r} against {theirs!r}"
        )


def fla_stand_in(chunk_size: int = 16, decays: bool = True, packed: bool = True):
    """A CPU stand-in for flash-linear-attention's chunk_gated_delta_rule (what
    minitx.attention.gdn.fla_kernel returns on CUDA), with its calling convention: (B, T, H, D)
    inputs, an initial and a final state per sequence, packed sequences through cu_seqlens (B = 1).
    It computes minitx's torch chunked form at another chunk size, as a kernel blocks the work its
    own way. The faults a check of fla's path must see: decays=False drops the decay (fla's #1272
    kind of bug), packed=False reads the packed row as one sequence (cu_seqlens ignored)."""
    import torch

    from minitx.attention.gdn import chunk_gated_delta

    def chunk_gated_delta_rule(
        q, k, v, g, beta, scale, initial_state=None, output_final_state=False, cu_seqlens=None
    ):
        q, k, v, g, beta = (t.transpose(1, 2) for t in (q, k, v, g, beta))  # (B, H, T, ...) as minitx's
        g = g if decays else torch.zeros_like(g)
        if cu_seqlens is None:
            o, h = chunk_gated_delta(q, k, v, g, beta, scale, chunk_size, initial_state)
            return o.transpose(1, 2), h
        assert q.shape[0] == 1, "fla takes packed sequences in one row"
        bounds = cu_seqlens.tolist() if packed else [0, q.shape[2]]
        outs, states = [], []
        for n, (a, b) in enumerate(zip(bounds, bounds[1:])):
            state = None if initial_state is None else initial_state[n : n + 1]
            o, h = chunk_gated_delta(*(t[:, :, a:b] for t in (q, k, v, g, beta)), scale, chunk_size, state)
            outs.append(o)
            states.append(h)
        states = states * (len(cu_seqlens) - 1) if not packed else states  # one per sequence, as fla's
        return torch.cat(outs, dim=2).transpose(1, 2), torch.cat(states)

    return chunk_gated_delta_rule


# SLURM's commands: ablate --launcher slurm looks for sbatch and srun, and asks squeue, scontrol
# and sacct of its jobs. A test whose answer depends on them puts its own first on PATH or hides
# them (tests/ablation/test_launch.py); .ci/run sets MINITX_HIDE_SLURM=1 for the fast suite, and
# tests/conftest.py then hides them from every test, as on a new user's machine.
SLURM_COMMANDS = ("sbatch", "srun", "scontrol", "squeue", "sacct")
HIDE_SLURM = "MINITX_HIDE_SLURM"


def path_without(commands: tuple[str, ...], path: str, scratch: Path) -> str:
    """`path` (a PATH) in which none of `commands` is found and all else is found as before: a
    folder that holds one of them is replaced by a folder in `scratch` of links to its other
    entries. (Leaving the folder out would lose the rest: /usr/bin holds python and sbatch alike.)"""
    kept = []
    for index, folder in enumerate(path.split(os.pathsep)):
        try:
            names = os.listdir(folder) if folder else []
        except OSError:  # not a folder: found nothing before, finds nothing now
            names = []
        if not any(name in commands for name in names):
            kept.append(folder)
            continue
        copy = scratch / f"path{index}"
        copy.mkdir(parents=True)
        for name in names:
            if name not in commands:
                (copy / name).symlink_to(Path(folder).absolute() / name)
        kept.append(str(copy))
    return os.pathsep.join(kept)
