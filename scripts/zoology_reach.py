"""What a model trained on Zoology's MQAR answers, and how: its per-query accuracy, the two heads
of its recall circuit, and with `--window w` its accuracy by how far each query lies from its
pair's value, against the reach of a sliding window of w tokens in two layers:

    python scripts/zoology_reach.py --ckpt runs/zoology/checkpoints/last.ckpt
    python scripts/zoology_reach.py --ckpt runs/zoology_window_32/checkpoints/last.ckpt --window 32

The circuit (minitx/evaluation/recall_circuit.py): the first layer's weight, at each value, on
its key (the previous-token head that binds the pair), and the last layer's weight, at each
query, on the value it asks for. A model on the 1/K plateau shows the first near zero.

The reach: a query at position q with its value at position j is within one layer's reach when
q - j <= w - 1 and within two layers' when q - j <= 2w - 3 (the first layer gathers the pair
into a token within w - 1 of it, the second reads that token from up to w - 1 further). A window
that works answers inside its reach and nothing outside it (a leak would answer outside).
"""

from __future__ import annotations

import argparse

import torch

from minitx.data.toy import IGNORE_INDEX, toy_batch
from minitx.data.zoology import ZoologyConfig, query_distances, zoology_sample
from minitx.evaluation.recall_circuit import recall_circuit
from minitx.trained_model import load_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", required=True, help="a checkpoint of a run on data.source zoology")
    parser.add_argument("--window", type=int, help="the window w of the reach to compare with")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--samples", type=int, default=1000, help="fresh samples (seed 12345)")
    parser.add_argument(
        "--circuit-samples", type=int, default=64, help="the first of them whose attention maps are read"
    )
    args = parser.parse_args()
    model, _, _ = load_checkpoint(args.ckpt)
    config = ZoologyConfig(vocab=args.vocab, pairs=args.pairs, seq_len=args.seq_len)
    samples = [zoology_sample(config, 12345, i) for i in range(args.samples)]
    x, y = toy_batch(samples, None, config.pad_id)
    scored = y != IGNORE_INDEX
    with torch.no_grad():
        right = (model(x, at=scored).argmax(-1) == y[scored]).numpy()
    print(f"per-query accuracy {right.mean():.3f} ({args.samples} samples)")
    few = min(args.circuit_samples, args.samples)
    circuit = recall_circuit(model.attention_maps(x[:few]), samples[:few])
    print(
        f"first layer, each value's weight on its key: {circuit.previous_key:.3f}; "
        f"last layer, each query's weight on its value: {circuit.value_read:.3f} ({few} samples)"
    )
    if args.window is None:
        return
    distance = query_distances(config, samples)
    w = args.window
    for name, where in (
        (f"<= {w - 1} (one layer)", distance <= w - 1),
        (f"{w + 1}..{2 * w - 3} (two layers)", (distance > w - 1) & (distance <= 2 * w - 3)),
        (f">= {2 * w - 1} (out of reach)", distance > 2 * w - 3),
    ):
        if where.any():
            print(f"distance {name}: accuracy {right[where].mean():.3f} over {int(where.sum())} queries")
        else:  # a window as long as the sequence leaves none out of reach
            print(f"distance {name}: no queries")
    print(
        f"all: {right.mean():.3f}; share of queries within two layers' reach: {(distance <= 2 * w - 3).mean():.3f}"
    )


if __name__ == "__main__":
    main()
