"""What checking files read back from disk costs: prepared token shards and checkpoint CRCs.

    python benchmarks/integrity.py                 # Shakespeare's shards, default and gpu-sized checkpoints
    python benchmarks/integrity.py --repeats 3 --configs default.yaml

Prepared data: a start stats the source files and the shards and reads the shard headers; the
checksum of every id is read only by `prepare.py --verify`. Checkpoints: `read_checkpoint` now reads every zip
entry once to compare it with its CRC-32 before torch.load; generation's `load_checkpoint`
(read, build the model, load the weights) is what a generate start spends on its checkpoint.
The checkpoints hold what training writes: weights, AdamW's two moments, the minitx entry.
Every figure is the best of --repeats (a shared machine only ever makes a run slower); files
are in the page cache, as they are when a run has just written them.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

import minitx.files.checkpoint as checkpoint_module
from minitx import ModelConfig, Transformer
from minitx.data.prepare import DataSettings, prepare
from minitx.data.shards import verify
from minitx.data.tokenizer import build_tokenizer
from minitx.files.configs import merged_config
from minitx.trained_model import load_checkpoint

REPO = Path(__file__).resolve().parents[1]


def best_ms(function: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return 1000 * min(times)


def shard_table(directory: Path, repeats: int) -> str:
    """What a start on prepared data costs (stats and headers), against a checksum of every shard
    (prepare.py --verify) and preparing from scratch."""
    import shutil

    settings = DataSettings(cache_dir=str(directory))
    prepare_ms = best_ms(
        lambda: (shutil.rmtree(directory, ignore_errors=True), prepare(settings, progress=False)), 1
    )
    prepared = prepare(settings)
    paths = prepared.train.paths + prepared.val.paths
    start = best_ms(lambda: prepare(settings), repeats)
    check = best_ms(lambda: [verify(path, prepared.tokenizer.vocab_size) for path in paths], repeats)
    size = sum(path.stat().st_size for path in paths)
    rows = [
        "| prepared data (Shakespeare, char) | ms |",
        "|---|---:|",
        f"| shards: {len(prepared.train) + len(prepared.val):,} tokens, {size / 1e6:.1f} MB in {len(paths)} files | |",
        f"| start on prepared data: fingerprint (stats), manifest, shard headers | {start:.1f} |",
        f"| prepare.py --verify: CRC-32 and largest id of every shard | {check:.1f} |",
        f"| prepare from the text (first start, or after a change) | {prepare_ms:.0f} |",
    ]
    return "\n".join(rows)


def training_checkpoint(config_name: str, path: Path) -> tuple[str, int]:
    """A checkpoint shaped like train.py's for configs/<config_name>: weights, AdamW state, minitx entry."""
    model_fields = merged_config(REPO / "configs" / config_name)["model"]
    shape = {
        k: v for k, v in model_fields.items() if k in ModelConfig.__dataclass_fields__ and k != "attention"
    }
    text = "".join(chr(32 + i) for i in range(65))
    config = ModelConfig(vocab_size=65, **shape)
    model = Transformer(config)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, 8, dtype=torch.long)).sum().backward()
    optimizer.step()
    checkpoint = {
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "optimizer_states": [optimizer.state_dict()],
        "global_step": 1,
        "minitx": {
            "format": 1,
            "model_config": config.to_dict(),
            "tokenizer": build_tokenizer("char", text).to_dict(),
        },
    }
    torch.save(checkpoint, path)
    return config_name, model.num_params()


def checkpoint_row(config_name: str, directory: Path, repeats: int) -> str:
    path = directory / f"{config_name}.ckpt"
    _, params = training_checkpoint(config_name, path)

    def fresh_check() -> None:
        checkpoint_module._CHECKED.clear()
        checkpoint_module.check_crcs(path)

    check = best_ms(fresh_check, repeats)
    load = best_ms(lambda: torch.load(path, weights_only=True), repeats)
    generate_start = best_ms(
        lambda: (checkpoint_module._CHECKED.clear(), load_checkpoint(str(path))), repeats
    )
    real_check = checkpoint_module.check_crcs
    checkpoint_module.check_crcs = lambda path: None
    try:
        unchecked_start = best_ms(lambda: load_checkpoint(str(path)), repeats)
    finally:
        checkpoint_module.check_crcs = real_check
    return (
        f"| {config_name} ({params / 1e6:.2f}M params) | {path.stat().st_size / 1e6:.1f} | {check:.1f} | {load:.1f} | "
        f"{unchecked_start:.1f} | {generate_start:.1f} | {100 * (generate_start / unchecked_start - 1):+.0f}% |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--configs", nargs="+", default=["default.yaml", "gpu.yaml"])
    parser.add_argument("--skip-shards", action="store_true", help="only the checkpoint table")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, one thread, "
        f"best of {args.repeats}, load average {os.getloadavg()[0]:.1f}\n"
    )
    with tempfile.TemporaryDirectory() as directory:
        if not args.skip_shards:
            print(shard_table(Path(directory), args.repeats) + "\n")
        print(
            "| checkpoint | MB | CRC check (ms) | torch.load (ms) | load_checkpoint before (ms) | after (ms) | change |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|")
        for config_name in args.configs:
            print(checkpoint_row(config_name, Path(directory), args.repeats), flush=True)
    print(f"\n(load average {os.getloadavg()[0]:.1f} at the end)")


if __name__ == "__main__":
    main()
