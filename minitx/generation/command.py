"""The `generate` command: the prompt, and text streamed as it is made (the model from its checkpoint: trained_model.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch
from torch import Tensor

from ..arguments import ArgumentParser, add_trust_argument
from ..decoding.loop import check_prompt_fits, generate
from ..decoding.sampling import check_options
from ..errors import UserError, one_line, require
from ..trained_model import load_checkpoint
from .inputs import check_generate_args


class TextStream:
    """Prints a growing continuation as it is made, for any tokenizer, in time independent of its length.

    BPE tokens can end in the middle of a character and some decoders change earlier text when
    more tokens arrive, so the tokens since the last settled point are decoded together with a few
    tokens before it (their text is subtracted) and only the new, settled suffix (not ending in an
    unfinished character, shown as U+FFFD) is printed. Every WINDOW tokens of settled text the
    point moves on, so no token is decoded more than about WINDOW + CONTEXT times.
    """

    CONTEXT, WINDOW = 8, 32

    def __init__(self, tokenizer, prompt_ids: list[int], out=None):
        self.tokenizer, self.ids, self.out = tokenizer, list(prompt_ids), out or sys.stdout
        self._settle(len(self.ids))

    def _settle(self, anchor: int) -> None:
        """Everything before ids[anchor] is printed; decoding restarts CONTEXT tokens before it."""
        self.anchor, self.start = anchor, max(0, anchor - self.CONTEXT)
        self.base = self.tokenizer.decode(self.ids[self.start : anchor])
        self.printed = ""

    def add(self, token_id: int) -> None:
        self.ids.append(token_id)
        self._show(final=False)

    def finish(self) -> None:
        self._show(final=True)
        self.out.write("\n")
        self.out.flush()

    def _show(self, final: bool) -> None:
        text = self.tokenizer.decode(self.ids[self.start :])
        if text.startswith(self.base):
            continuation = text[len(self.base) :]
        else:  # a decoder that rewrites the text before (spacing rules): show the new tokens alone
            continuation = self.tokenizer.decode(self.ids[self.anchor :])
        whole = continuation  # settled when it ends in no unfinished character and is all printed
        if not final:
            continuation = continuation.rstrip("\ufffd")
        if continuation.startswith(self.printed) and len(continuation) > len(self.printed):
            self.out.write(continuation[len(self.printed) :])
            self.out.flush()
            self.printed = continuation
        if whole == self.printed and len(self.ids) - self.anchor >= self.WINDOW:
            self._settle(len(self.ids))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = ArgumentParser(
        prog="generate.py", description="Generate text from a checkpoint saved by train.py."
    )
    parser.add_argument("--ckpt", required=True, help="checkpoint file (.ckpt) saved by train.py")
    prompt = parser.add_mutually_exclusive_group()
    prompt.add_argument(
        "--prompt",
        help="text to continue (default: the end-of-text token if the tokenizer has one, else a newline)",
    )
    prompt.add_argument("--prompt-file", help="read the prompt from this UTF-8 file")
    parser.add_argument(
        "--max-new-tokens", type=int, default=200, help="tokens to generate per sample (default 200)"
    )
    parser.add_argument(
        "--temperature", type=float, default=0.8, help="0 = greedy; higher = more random (default 0.8)"
    )
    parser.add_argument("--top-k", type=int, default=None, help="sample only from the k most likely tokens")
    parser.add_argument(
        "--top-p",
        type=float,
        default=None,
        help="sample only from the smallest set of tokens with probability >= p",
    )
    parser.add_argument(
        "--num-samples", type=int, default=1, help="independent samples, one after another (default 1)"
    )
    parser.add_argument("--seed", type=int, default=None, help="seed for reproducible sampling")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps, ... (default cpu)")
    parser.add_argument(
        "--no-cache", action="store_true", help="recompute the whole context each step (slow; for checking)"
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="decode with torch.compile: the first token waits for the compile (tens of seconds), "
        "every later one is faster (see benchmarks/RESULTS.md)",
    )
    add_trust_argument(parser)
    return parser.parse_args(argv)


def _read_prompt(args: argparse.Namespace, tokenizer) -> tuple[str, list[int]]:
    """(text to echo, token ids) of the prompt."""
    if args.prompt_file is not None:
        try:
            with open(args.prompt_file, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            raise UserError(
                f"--prompt-file {args.prompt_file}: no such file; give an existing text file"
            ) from None
        except (OSError, UnicodeDecodeError) as error:
            raise UserError(
                f"--prompt-file {args.prompt_file}: cannot be read as UTF-8 text ({one_line(error, 200)})"
            ) from None
    else:
        text = args.prompt or ""
    if text:
        try:
            ids = tokenizer.encode(text)  # a char tokenizer raises UserError naming unknown characters
        except UserError as error:
            source = f"--prompt-file {args.prompt_file}" if args.prompt_file is not None else "--prompt"
            raise UserError(f"{source}: {error}") from None
        if ids:
            return text, ids
    if tokenizer.eos_id is not None:
        return "", [tokenizer.eos_id]  # no prompt: start a fresh document
    try:
        return "", tokenizer.encode("\n")
    except UserError:
        raise UserError(
            "--prompt: this tokenizer does not know a newline to start from; give a --prompt"
        ) from None


def usable_device(name: str) -> torch.device:
    try:
        device = torch.device(name)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError, ValueError) as error:
        raise UserError(
            f"--device {name}: not usable here ({one_line(error, 200)}); use --device cpu"
        ) from None
    return device


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    check_options(args.max_new_tokens, args.temperature, args.top_k, args.top_p, cli=True)
    check_generate_args(args)
    require(args.num_samples >= 1, f"--num-samples: is {args.num_samples}; use 1 or more")
    device = usable_device(args.device)
    model, tokenizer, _ = load_checkpoint(
        args.ckpt, map_location=device, label="--ckpt", trust_kind_modules=args.trust_kind_modules
    )
    if args.compile:
        # The first token waits for dynamo and the compiler, silently for tens of seconds on a
        # CPU: one line says the wait is the compile, not a hang.
        print(
            "generate: compiling the model (torch.compile): the first tokens wait for it, "
            "tens of seconds on a CPU (docs/generation.md: when it pays)",
            file=sys.stderr,
            flush=True,
        )
        model = torch.compile(model)  # generate's loop calls it; its caches stay the model's
    prompt_text, prompt_ids = _read_prompt(args, tokenizer)
    if not args.no_cache:
        check_prompt_fits(model.config, len(prompt_ids))
    generator = torch.Generator(device=device).manual_seed(args.seed) if args.seed is not None else None
    idx = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    options = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, generator=generator)
    options.update(use_cache=not args.no_cache, eos_id=tokenizer.eos_id)
    for sample in range(args.num_samples):
        if sample:
            print("---------------")
        sys.stdout.write(prompt_text)
        stream = TextStream(tokenizer, prompt_ids)

        def show(token: Tensor, stream: TextStream = stream) -> None:
            if token.item() != tokenizer.eos_id:  # the end-of-text token itself is not shown
                stream.add(token.item())

        generate(model, idx, args.max_new_tokens, on_token=show, **options)
        stream.finish()
