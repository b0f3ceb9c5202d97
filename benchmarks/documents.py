"""What attention inside its document costs: a training step with and without document masking.

    python benchmarks/documents.py                       # every kind and variant, T = 256 and 1024
    python benchmarks/documents.py --kinds mha local --repeats 3
    python benchmarks/documents.py --quick               # toy sizes, seconds: the code runs
    python benchmarks/documents.py --kinds mta --seq-lens 256 --threads 1 --cpu-time   # a loaded machine

Each row's model is the default one (configs/default.yaml's shape) with the attention section of
configs/<row>.yaml, as in benchmarks/variants.py; local attention's global tokens are the
sequence's first and are refused with documents, so its row sets n_global to 0 on both sides.
The batch (--batch x T random tokens) is packed with documents of random lengths, mean --doc-len
tokens (TinyStories' stories average about 200 tokens), each starting with the document token.

Per row and T: the best training step (forward, backward, AdamW) without documents and with
`document_token` set, the two taking turns, and their ratio; the issue's goal is a ratio of at
most GOAL. mha/mqa/gqa, mla, diff and the softmax options mask SDPA in blocks of queries; local
cuts its chunked window; MTA runs each row whole, each row seeing its own document (its C loops),
or each document's piece alone where that costs fewer scores (minitx/attention/mta/layer.py).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import time

import torch
import torch.nn.functional as F
from variants import VARIANTS, VOCAB, attention_section, config_of, default_shape, keep_best

from minitx import Transformer

GOAL = 1.1  # issue 34 (1.2 before it)
DOC = 0  # the document token of these batches


def packed(batch: int, T: int, doc_len: int, seed: int = 0) -> torch.Tensor:
    """(batch, T + 1) random tokens cut into documents of random lengths (mean doc_len)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, VOCAB, (batch, T + 1), generator=generator)
    starts = torch.rand(batch, T + 1, generator=generator) < 1 / doc_len
    starts[:, 0] = True
    tokens[starts] = DOC
    return tokens


def step_seconds(
    shape: dict, attention: dict, T: int, tokens: torch.Tensor, repeats: int, clock=time.perf_counter
) -> dict:
    """Best seconds of a training step without (None) and with documents (DOC), by `clock`."""
    x, y = tokens[:, :-1], tokens[:, 1:]
    runs = {}
    for token in (None, DOC):
        torch.manual_seed(0)
        model = Transformer(config_of(shape, attention, block_size=T, document_token=token)).train()
        runs[token] = (model, torch.optim.AdamW(model.parameters(), lr=1e-3))

    def step(model, optimizer) -> None:
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for run in runs.values():  # warm-up
        step(*run)
    best: dict = {}
    for _ in range(repeats):
        for token, run in runs.items():
            start = clock()
            step(*run)
            keep_best(best, token, clock() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kinds", nargs="+", default=list(VARIANTS))
    parser.add_argument("--seq-lens", nargs="+", type=int, default=[256, 1024])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--doc-len", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time steps by this thread's CPU time (time.thread_time), not the wall clock: steadier "
        "beside other work; with --threads 1, where all of a step's CPU work runs on this thread",
    )
    parser.add_argument("--quick", action="store_true", help="toy sizes: checks that the code runs")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = default_shape()
    if args.quick:
        args.seq_lens, args.batch, args.repeats, args.doc_len = [48], 2, 1, 12
        shape.update(d_model=32)
    print(
        f"# document masking: training step with / without, {platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {datetime.date.today()}"
        + (", thread CPU time" if args.cpu_time else "")
    )
    print(f"# batch {args.batch} x T, documents of mean length {args.doc_len}, best of {args.repeats}")
    print()
    print("| row | T | without (ms) | with documents (ms) | ratio | goal <= " + f"{GOAL} |")
    print("|---|---:|---:|---:|---:|---|")
    for name in args.kinds:
        attention, why = attention_section(name)
        if attention is None:
            print(f"| {name} | - | - | - | - | not available: {why} |")
            continue
        options = attention.get("options", {})
        if "local" in options:  # global tokens are refused with documents (check_local_model)
            attention = dict(attention, options=dict(options, local=dict(options["local"], n_global=0)))
            name = f"{name} (n_global 0)"
        for T in args.seq_lens:
            tokens = packed(args.batch, T, args.doc_len)
            clock = time.thread_time if args.cpu_time else time.perf_counter
            best = step_seconds(shape, attention, T, tokens, args.repeats, clock)
            ratio = best[DOC] / best[None]
            verdict = "met" if ratio <= GOAL else "**missed**"
            print(
                f"| {name} | {T} | {best[None] * 1e3:.0f} | {best[DOC] * 1e3:.0f} | {ratio:.2f} | {verdict} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
