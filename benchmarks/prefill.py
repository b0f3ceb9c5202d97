"""Prefill of a prompt longer than block_size: with the KV cache and without it.

    python benchmarks/prefill.py                          # default model shape, prompts of 1x..8x block_size
    python benchmarks/prefill.py --prompt-blocks 2 4 --kinds mha local mta

With a cache, the first block_size tokens go in one pass and the rest in chunks of block_size
(one token at a time for MTA, whose cached rows share one key cut-off); without it, one forward
pass over the last block_size tokens. Random weights, batch 1, greedy, one new token, one torch
thread; each figure is the best CPU time of --repeats runs.
"""

from __future__ import annotations

import argparse
import time

import torch

from minitx import AttentionConfig, ModelConfig, Transformer

KINDS = {
    "mha": {"kind": "mha"},
    "local": {"kind": "local", "options": {"local": {"window": 64}}},
    "mta": {"kind": "mta"},
}


def best_cpu_seconds(model: Transformer, prompt: torch.Tensor, use_cache: bool, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.process_time()
        model.generate(prompt, 1, temperature=0, use_cache=use_cache)
        times.append(time.process_time() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument(
        "--prompt-blocks", nargs="+", type=int, default=[1, 2, 8], help="prompt length in block_sizes"
    )
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"torch {torch.__version__}, block_size {args.block_size}, d_model {args.d_model}, n_layer {args.n_layer}\n"
    )
    print("| kind | prompt tokens | with cache (CPU s) | without cache (CPU s) | cache / no cache |")
    print("|---|---:|---:|---:|---:|")
    for kind in args.kinds:
        torch.manual_seed(0)
        config = ModelConfig(
            vocab_size=65,
            block_size=args.block_size,
            n_layer=args.n_layer,
            d_model=args.d_model,
            attention=AttentionConfig(**KINDS[kind]),
        )
        model = Transformer(config).eval()
        for blocks in args.prompt_blocks:
            prompt = torch.randint(0, 65, (1, blocks * args.block_size))
            cached = best_cpu_seconds(model, prompt, True, args.repeats)
            cropped = best_cpu_seconds(model, prompt, False, args.repeats)
            print(f"| {kind} | {prompt.shape[1]} | {cached:.3f} | {cropped:.3f} | {cached / cropped:.1f} |")


if __name__ == "__main__":
    main()
