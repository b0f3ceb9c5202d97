"""lm-evaluation-harness scores a minitx checkpoint: an `lm_eval` LM over the minitx model itself.

    python evaluate.py --ckpt CKPT --lm-eval-tasks hellaswag,lambada_openai   (tasks download data)
    lm_eval --model minitx --model_args ckpt=CKPT --tasks ...                (once minitx.hf.lm_eval_adapter is imported)

A checkpoint of an attention kind defined outside minitx loads only with consent to import its
modules: `--trust-kind-modules`, or `trust_kind_modules=true` in --model_args.

A token's log-probability is the one minitx's training loss uses: log_softmax of the model's
logits at the position before it. A text with no token before its first one (an empty context)
is conditioned on the tokenizer's end-of-text token; a tokenizer without one (char) cannot
predict the first token, so that token only conditions the rest. Texts longer than block_size
are scored block_size tokens at a time, each with up to block_size tokens of what precedes them.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from ..errors import UserError, one_line
from ..network import require_hub_for_tasks
from ..trained_model import load_checkpoint
from . import require

lm_eval_api = require("lm_eval.api.model")
lm_eval_registry = require("lm_eval.api.registry")
lm_eval_utils = require("lm_eval.utils")
lm_eval_evaluator = require("lm_eval.evaluator")
lm_eval_tasks = require("lm_eval.tasks")


class StopGeneration(Exception):
    """Raised from the decode loop's per-token callback once a stop string has appeared."""


@lm_eval_registry.register_model("minitx")
class MinitxLM(lm_eval_api.LM):
    def __init__(self, model, tokenizer, device: str = "cpu"):
        super().__init__()
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self._device = torch.device(device)
        self.block_size = model.config.block_size

    @classmethod
    def from_checkpoint(cls, ckpt: str, device: str = "cpu", trust_kind_modules: bool = False) -> MinitxLM:
        model, tokenizer, _ = load_checkpoint(
            ckpt, map_location=device, label="--ckpt", trust_kind_modules=trust_kind_modules
        )
        return cls(model, tokenizer, device)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> MinitxLM:
        """`--model_args ckpt=CKPT[,device=cuda][,trust_kind_modules=true]` of lm_eval's command."""
        args = lm_eval_utils.simple_parse_args_string(arg_string)
        return cls.from_checkpoint(
            args["ckpt"],
            args.get("device", (additional_config or {}).get("device") or "cpu"),
            trust_kind_modules=str(args.get("trust_kind_modules", False)).lower() in ("true", "1"),
        )

    # -- scoring -----------------------------------------------------------------------------
    @torch.inference_mode()
    def score(self, context: list[int], target: list[int]) -> tuple[float, bool]:
        """(sum of log p(target tokens | what precedes each), whether each was the argmax). Targets
        go in runs of at most block_size, each run after as much of what precedes it as fits."""
        ids, total, greedy = context + target, 0.0, True
        for start in range(len(context), len(ids), self.block_size):
            stop = min(start + self.block_size, len(ids))
            inputs = torch.tensor([ids[max(0, stop - 1 - self.block_size) : stop - 1]], device=self._device)
            logprobs = F.log_softmax(self.model(inputs)[0, start - stop :].float(), dim=-1)
            wanted = torch.tensor(ids[start:stop], device=self._device)
            total += float(logprobs.gather(-1, wanted[:, None]).sum())
            greedy = greedy and bool((logprobs.argmax(-1) == wanted).all())
        return total, greedy

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Token ids of context and continuation as the whole text splits them (trailing spaces of
        the context go to the continuation, as lm-eval's own models do)."""
        stripped = context.rstrip(" ")
        continuation = context[len(stripped) :] + continuation
        whole = self.tokenizer.encode(stripped + continuation)
        context_ids = self.tokenizer.encode(stripped) if stripped else []
        return self.with_start(context_ids + whole[len(context_ids) :], len(context_ids))

    def with_start(self, ids: list[int], n_context: int) -> tuple[list[int], list[int]]:
        if n_context:
            return ids[:n_context], ids[n_context:]
        if self.tokenizer.eos_id is not None:
            return [self.tokenizer.eos_id], ids
        return ids[:1], ids[1:]  # no end-of-text token: the first token can only condition

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        pairs = [self.encode_pair(*request.args) for request in requests]
        return [self.score(context, target) if target else (0.0, True) for context, target in pairs]

    def loglikelihood_rolling(self, requests) -> list[float]:
        pairs = [self.with_start(self.tokenizer.encode(request.args[0]), 0) for request in requests]
        return [self.score(context, target)[0] for context, target in pairs]

    # -- generation ----------------------------------------------------------------------------
    def generate_until(self, requests) -> list[str]:
        return [self.generate_one(*request.args) for request in requests]

    @torch.inference_mode()
    def generate_one(self, context: str, options: dict) -> str:
        until = options.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        eos = self.tokenizer.eos_id
        if eos is not None:
            until.append(self.tokenizer.decode([eos]))
        max_new = int(options.get("max_gen_toks", 256))
        temperature = float(options.get("temperature", 0.0)) if options.get("do_sample", False) else 0.0
        prompt = self.tokenizer.encode(context)[-self.block_size :]
        if not prompt:
            if eos is None:
                return ""  # nothing to condition on: a tokenizer without end-of-text cannot start
            prompt = [eos]
        new: list[int] = []

        def stop_at_strings(token: torch.Tensor) -> None:
            new.append(int(token[0]))
            if any(stop in self.tokenizer.decode(new) for stop in until):
                raise StopGeneration

        ids = torch.tensor([prompt], device=self._device)
        with contextlib.suppress(StopGeneration):
            self.model.generate(ids, max_new, temperature=temperature, eos_id=eos, on_token=stop_at_strings)
        text = self.tokenizer.decode(new)
        for stop in until:
            text = text.split(stop)[0]
        return text


def evaluate_tasks(
    ckpt: str,
    tasks: list[str],
    device: str = "cpu",
    limit: int | None = None,
    include_path: str | None = None,
    log_samples: bool = False,
    trust_kind_modules: bool = False,
) -> dict:
    """lm-eval's results for a checkpoint on named tasks (the harness's own, or YAML files in
    `include_path`). Most harness tasks download their data on first use: this needs the network.
    `trust_kind_modules`: as minitx.trained_model.load_checkpoint's."""
    # A bad (or untrusted) checkpoint fails before the task index is read.
    lm = MinitxLM.from_checkpoint(ckpt, device, trust_kind_modules=trust_kind_modules)
    require_hub_for_tasks(tasks, include_path)
    # Indexing the harness's thousands of task files takes a while: skip it when `include_path` has them all.
    manager = (
        lm_eval_tasks.TaskManager(include_path=include_path, include_defaults=False) if include_path else None
    )
    if manager is None or any(task not in manager.all_tasks for task in tasks):
        manager = lm_eval_tasks.TaskManager(include_path=include_path)
    if unknown := [task for task in tasks if task not in manager.all_tasks]:
        raise UserError(f"--lm-eval-tasks: unknown task(s) {', '.join(unknown)}; see `lm_eval ls tasks`")
    try:
        return lm_eval_evaluator.simple_evaluate(
            model=lm, tasks=tasks, limit=limit, task_manager=manager, log_samples=log_samples
        )
    except (ConnectionError, TimeoutError, OSError) as err:
        raise UserError(
            f"--lm-eval-tasks: the data of {','.join(tasks)} could not be read ({one_line(err, 200)}); "
            "it needs the network, or HF_DATASETS_OFFLINE=1 with the data already cached"
        ) from None


def results_table(results: dict) -> str:
    return lm_eval_utils.make_table(results)
