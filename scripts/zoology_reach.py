"""Per-query accuracy of a model trained on Zoology's MQAR, by how far each query lies from its
pair's value, against the reach of a sliding window of `--window` tokens in two layers:

    python scripts/zoology_reach.py --ckpt runs/zoology_window_32/checkpoints/last.ckpt --window 32

A query at position q with its value at position j is within one layer's reach when
q - j <= w - 1 and within two layers' when q - j <= 2w - 3 (the first layer gathers the pair
into a token within w - 1 of it, the second reads that token from up to w - 1 further). A window
that works answers inside its reach and nothing outside it (a leak would answer outside).
"""

from __future__ import annotations

import argparse

import torch

from minitx.data.toy import IGNORE_INDEX, toy_batch
from minitx.data.zoology import ZoologyConfig, query_distances, zoology_sample
from minitx.files.checkpoint import load_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", required=True, help="a checkpoint of a run on data.source zoology")
    parser.add_argument("--window", type=int, required=True, help="the window w of the reach to compare with")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--samples", type=int, default=1000, help="fresh samples (seed 12345)")
    args = parser.parse_args()
    model, _, _ = load_checkpoint(args.ckpt)
    config = ZoologyConfig(vocab=args.vocab, pairs=args.pairs, seq_len=args.seq_len)
    samples = [zoology_sample(config, 12345, i) for i in range(args.samples)]
    x, y = toy_batch(samples, None, config.pad_id)
    scored = y != IGNORE_INDEX
    with torch.no_grad():
        right = (model(x, at=scored).argmax(-1) == y[scored]).numpy()
    distance = query_distances(config, samples)
    w = args.window
    for name, where in (
        (f"<= {w - 1} (one layer)", distance <= w - 1),
        (f"{w + 1}..{2 * w - 3} (two layers)", (distance > w - 1) & (distance <= 2 * w - 3)),
        (f">= {2 * w - 1} (out of reach)", distance > 2 * w - 3),
    ):
        print(f"distance {name}: accuracy {right[where].mean():.3f} over {int(where.sum())} queries")
    print(
        f"all: {right.mean():.3f}; share of queries within two layers' reach: {(distance <= 2 * w - 3).mean():.3f}"
    )


if __name__ == "__main__":
    main()
