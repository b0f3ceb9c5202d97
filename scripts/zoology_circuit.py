"""The recall circuit of a model trained on Zoology's MQAR: has its first layer formed the
previous-token head (each value's attention on its key), and does its last layer read the value
a query asks for? (minitx/evaluation/recall_circuit.py says what the two weights are.)

    python scripts/zoology_circuit.py --ckpt runs/zoology/checkpoints/last.ckpt

A model that solves the task shows both weights high; one on the 1/K plateau shows the first
near zero.
"""

from __future__ import annotations

import argparse

import torch

from minitx.data.toy import IGNORE_INDEX, toy_batch
from minitx.data.zoology import ZoologyConfig, zoology_sample
from minitx.evaluation.recall_circuit import recall_circuit
from minitx.files.checkpoint import load_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", required=True, help="a checkpoint of a run on data.source zoology")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--samples", type=int, default=64, help="fresh samples (seed 12345)")
    args = parser.parse_args()
    model, _, _ = load_checkpoint(args.ckpt)
    config = ZoologyConfig(vocab=args.vocab, pairs=args.pairs, seq_len=args.seq_len)
    samples = [zoology_sample(config, 12345, i) for i in range(args.samples)]
    x, y = toy_batch(samples, None, config.pad_id)
    scored = y != IGNORE_INDEX
    with torch.no_grad():
        right = (model(x, at=scored).argmax(-1) == y[scored]).float().mean().item()
    circuit = recall_circuit(model.attention_maps(x), samples)
    print(
        f"first layer, each value's weight on its key: {circuit.previous_key:.3f}; "
        f"last layer, each query's weight on its value: {circuit.value_read:.3f}; "
        f"per-query accuracy {right:.3f} ({args.samples} samples)"
    )


if __name__ == "__main__":
    main()
