"""One command that checks and measures every GPU path, for a short slot on a GPU machine.

    python benchmarks/gpu.py --out gpu-results                   # CUDA, configs/gpu.yaml's model
    python benchmarks/gpu.py --device cpu --tiny --out /tmp/gpu   # the same code at toy sizes, seconds
    python benchmarks/gpu.py --out DIR --only checks decode --kinds mha local

Writes DIR/results.json and DIR/results.md; exit status 0 when every check passes, 1 when one
fails (a section that raises is a failed check, and the other sections still run), 2 for bad input.

Models: configs/gpu.yaml's shape (6 layers, 6 heads, width 384, context 256, dropout 0.2, char
vocabulary of 65) with each kind's attention section from its own config file: mha, mqa, gqa
(configs/gqa.yaml), local (configs/local.yaml), mta (configs/mta.yaml: the released setting,
pre- and post-softmax 6 x 11 kernels, head mixing both sides, output norm); the 2024-25 variants,
each with the attention section of its file: mla (configs/mla.yaml: multi-head latent attention),
diff (configs/diff.yaml: differential attention), qknorm, sinks and gated (configs/qknorm.yaml,
sinks.yaml, gated.yaml: mha with QK-norm, learned sinks, an elementwise output gate); the MLP stays
gpu.yaml's (the swiglu that mla.yaml, diff.yaml and qknorm.yaml set for export is not taken), so the
models differ in attention alone. Linear attention by its files too: gdn (configs/gdn.yaml: Gated
DeltaNet in every layer) and hybrid (configs/hybrid.yaml: three gdn layers, then gated mha with
QK-norm, as Qwen3-Next), through every check, training (compiled too) and decoding. A variant whose
file is missing or whose kind is not registered is listed as skipped and the rest run. And one mix of the five kinds (checks only), which also
carries the three options, each on another kind: sinks on its local layers, the gate on gqa's,
QK-norm on mha's (MIX_OPTIONS). --tiny shrinks every size, not the code path.

Checks, for each kind and the mix (random weights, MTA's identity-initialised parts perturbed so
that a wrong convolution or mix would show):
- precision: logits of the bf16-autocast model on --device against the float32 model on the CPU
  with the same weights (see PRECISION_TOL for the tolerance and why);
- causal: minitx.verify.causality_violation on --device under bf16 autocast;
- cache: greedy decoding with the KV cache equal to decoding without, on --device, float32;
- train step: one bf16-autocast forward and backward in training mode, every gradient finite.
- muon precision (mha): Muon's Newton-Schulz dtype by default on the device
  (model.optimizer_options.muon.precision auto: bfloat16 on CUDA, as the reference Muon, float32
  on a CPU), and 30 steps of training with bfloat16 Newton-Schulz against float32, same weights
  and batches: final losses within MUON_PRECISION_TOL.
Local attention takes flex attention on CUDA and the chunked path on the CPU; the check's detail
says which path ran, counted by wrapping both functions.
- triton vs conv (CUDA only): the mta model (released setting) and the same with the pre-softmax
  convolution only, without dropout, through the MTA backend triton against the same weights through
  conv, on --device in float32 with TF32 off: logits and every parameter's gradient (TRITON_TOL).
- fla vs torch (CUDA, with flash-linear-attention installed): gdn and the hybrid through fla's Triton
  kernels (backend fla) against the torch chunked form, same weights, float32 with TF32 off: logits
  and every gradient (FLA_TOL), and fla's kernels counted in every gdn layer. On auto, CUDA takes
  fla's kernels when installed, so the other checks and the rows run them there.
- fla vs torch, documents: the same on packed documents (each row cut in two elsewhere), which fla
  takes as packed sequences through cu_seqlens (minitx.attention.gdn.delta_rule.fla_chunk).

Measurements: training tokens/s and MFU of each kind (bare loop, bf16 autocast, AdamW), compiled
and not (the options qknorm, sinks and gated eager only: COMPILED_TRAINING_KINDS); one attention
layer's forward + backward in bf16 at T = 1k, 4k and 16k with the same tokens per step (SDPA MHA,
local through flex against the same window as a dense mask, MTA, and each variant with its time
and memory over mha's), with peak memory (benchmarks/attention.py's helpers); decoding tokens/s
with and without the cache, and
with it through torch.compile for mha and mta (mta at least DECODE_GOAL of mha is checked both ways);
and configs/gpu.yaml end to end through train.py for a few hundred steps (val loss, wall time).
MTA in the attention section: on the CPU `mta` (auto); on CUDA `mta (torch)`, the torch path that
auto took there before the Triton kernels (factorised above 512 tokens), and the Triton kernels as
`mta-triton` (pre-softmax convolution only) and `mta-both-triton` (the released layer), each with
its time and peak memory over mha's at the same T; the issue's goal, each triton row's time
<= ATTENTION_GOAL x mha's at T = 4k and 16k, is a check there (a miss fails it, the suite goes on).

What runs only on CUDA is listed as skipped on the CPU (results.json's "skipped"): there the Triton
kernels would run in Triton's interpreter, seconds per step at T = 30.

Time the five variants add on one H100 (an estimate; the suite has not run on a GPU yet): checks
about 5 s each (the cache check's two greedy decodings of 254 tokens dominate), eager training a
second each, two more compiled models (mla, diff) 20-60 s each for inductor, decoding with and
without the cache about 2 s each, their attention-layer rows a few seconds: about 1.5-2.5 minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import importlib.util
import json
import math
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's minitx, installed or not

import torch  # noqa: E402
import yaml  # noqa: E402

from minitx import AttentionConfig, ModelConfig, Transformer, verify  # noqa: E402
from minitx.arguments import ArgumentParser  # noqa: E402
from minitx.attention import local  # noqa: E402
from minitx.attention.mta import native  # noqa: E402
from minitx.decoding.loop import generate  # noqa: E402
from minitx.errors import UserError, one_line  # noqa: E402
from minitx.files.configs import merged  # noqa: E402
from minitx.training import lm_loss, optimizer_groups, peak_flops  # noqa: E402
from minitx.training.optim import Optimisation, Parameters, muon_dtype  # noqa: E402


def _load_attention_benchmark():
    spec = importlib.util.spec_from_file_location("attention_benchmark", REPO / "benchmarks" / "attention.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


attention_bench = _load_attention_benchmark()

VOCAB = 65  # the character vocabulary of the built-in Shakespeare, which gpu.yaml trains on
KINDS = ("mha", "mqa", "gqa", "local", "mta")
# The 2024-25 variants, each by its config file: two kinds (mla, diff) and three options of every
# softmax kind, which their files set on mha (qknorm, sinks, gated). The suite runs those whose file
# exists and whose kind is registered (available_kinds).
VARIANTS = ("mla", "diff", "qknorm", "sinks", "gated")
# Linear attention, by its config files: Gated DeltaNet in every layer (configs/gdn.yaml) and
# Qwen3-Next's 3:1 hybrid (configs/hybrid.yaml: three gdn layers, then gated mha with QK-norm).
LINEAR = ("gdn", "hybrid")
ALL_KINDS = (*KINDS, *VARIANTS, *LINEAR)
# The mix also carries the variants that are options, each on a kind other than mha (where its
# config file sets it): sinks on local (the head that may attend to nothing where it sees least),
# the gate on gqa, QK-norm on mha. The two new kinds stay out of it: the mix is the five kinds.
MIX_OPTIONS = {"local": "sinks", "gqa": "gated", "mha": "qknorm"}
SECTIONS = ("checks", "train", "attention", "decode", "e2e")

# bf16 keeps 8 significant bits: one rounding is off by up to 2^-9 (0.2%) of the value. Autocast
# rounds the inputs of every matrix product (about ten per layer, forward only), and independent
# roundings add in quadrature over the layers, so a correct model's logits differ from float32 by
# about 1% of their spread (measured on the CPU: 0.3-0.8% at both sizes, every kind and the mix).
# A real fault (a mask one token off, a wrong kv head, a dropped convolution) moves them by tens of
# percent of their spread with these weights; 5% leaves room for CUDA's bf16 kernels summing in
# another order. The loss is a mean over many tokens, so its rounding noise averages out: 0.02 nats
# is 0.5% of ln 65 = 4.17 and fifty times the largest difference measured (4e-4).
PRECISION_TOL = {"logits_rel_rms": 0.05, "loss_abs": 0.02}
# Past logits must not move at all when future tokens change: the same kernels run on the same past
# inputs. The bound only allows for a kernel that orders a sum differently; leaks that the tests
# plant move logits by more than 1e-3.
CAUSAL_TOL = 1e-5
DOCUMENT_TOKEN = 0  # check_documents and the training rows with documents start each at this id
# Cached decoding and one forward pass compute the same sums in float32 (about 1e-6 apart, measured);
# on CUDA the convolutions of MTA may run in TF32 (10-bit mantissa, 5e-4 per rounding). A cache that
# drops or mis-scales attention moves the logits by 0.08-0.45 of their spread at these sizes.
CACHE_TOL = 1e-2
# the MTA backend triton against conv, same weights, same device, float32 with TF32 off (cuDNN's
# convolutions of the conv path would otherwise round their inputs to 10 bits, 5e-4; the kernels
# use IEEE float32 products in float32). The two then differ only in summation order: tiles of keys
# with the row statistics of a first pass against whole rows, atomic adds of the key-side gradients.
# Float32 rounds by 6e-8 and sums of hundreds of terms through the layers leave about 1e-6 of a
# value: measured in Triton's interpreter at --tiny sizes (T = 12 and 40), logits 3e-7 apart and
# most gradients 1e-6. The gradients of the post-softmax head mix cancel (they sum over rows of
# weights that sum to one): there conv's own float32 result is up to 1.2e-5 from float64 and
# triton's 2.5e-5 from conv. So the bound of each gradient is TRITON_TOL or, where float32 itself
# does worse, TRITON_NOISE_FACTOR times conv's own error against a float64 copy on the CPU (the
# tiny runs: triton-vs-conv at most 5.5x conv's own error). Errors are relative to the float64
# gradient's L2 norm; the logits' is the RMS error over their spread. A real fault (a transposed
# head mix, a post-kernel tap, a mask one key off) moves logits or some gradient by 1e-2 or more.
TRITON_TOL = 1e-4
TRITON_NOISE_FACTOR = 10
# The goal for the Triton kernels: forward + backward of the layer within this factor of
# SDPA MHA's at these lengths (one H100, bf16).
ATTENTION_GOAL = 2.0
GOAL_SEQ_LENS = (4096, 16384)
# The same issue's goal for decoding: the released MTA model's cached tokens/s at least this
# fraction of MHA's (batch 1; eager and compiled are each checked).
DECODE_GOAL = 0.8
# Compiled decoding for the goal's two kinds only: each compiles 4-6 graphs (tens of seconds on the
# CPU side), and the suite must fit one short slot; benchmarks/generate.py --compile times them all.
COMPILED_DECODING_KINDS = ("mha", "mta")
# Compiled training for the five kinds and the two new kinds; the three options' graphs are mha's with
# one small op more, so they are trained eager only: inductor takes 20-60 s per model, and three more
# would cost a couple of minutes of the slot.
COMPILED_TRAINING_KINDS = (*KINDS, "mla", "diff", *LINEAR)
# The goal for the variants: a training step within this factor of mha's (training tokens/s at
# least 1 / TRAIN_GOAL of mha's), compiled where the variant is compiled, else eager.
TRAIN_GOAL = 1.3
TRITON_ROWS = ("mta-triton", "mta-both-triton")
# gdn through flash-linear-attention's Triton kernels (backend fla) against its torch path (the
# chunked WY/UT form), same weights, same device, float32 with TF32 off. Both sum the same chunked
# products in another order and fla may round its dot products' inputs to TF32 inside the kernels
# (10-bit mantissa, 5e-4 per rounding): errors of 1e-4 to 1e-3 of the logits' spread are expected
# (not yet measured on a GPU). A real fault (the decay missed, a head order swapped, beta or the
# scale applied twice) moves the logits by tens of percent.
FLA_TOL = 5e-3
CUDA_ONLY = "skipped: CUDA only (on the CPU the Triton kernels run in Triton's interpreter, seconds per step)"
FLA_CUDA_ONLY = "skipped: CUDA only (flash-linear-attention's kernels have no CPU path)"
NO_FLA = "skipped: flash-linear-attention is not installed (pip install flash-linear-attention)"
# Muon's Newton-Schulz in bfloat16 (the default on CUDA, model.optimizer_options.muon.precision
# auto) against float32: the same model, weights and batches trained MUON_CHECK_STEPS steps with
# each, the final losses compared. Newton-Schulz only pushes singular values towards 1 (to within about +-0.3 in either
# dtype), so bf16's rounding moves each update by about 2^-9 of itself and the losses stay
# together: measured on the CPU at --tiny sizes, 3e-4 nats apart after 30 steps (4.21 -> 2.02).
# Broken on purpose there, bf16 with one iteration instead of five ends 0.076 apart, a transposed
# update 2.3 apart.
MUON_CHECK_STEPS = 30
MUON_PRECISION_TOL = 0.02  # nats


@dataclass
class Sizes:
    """Every size the suite uses; `tiny` shrinks them all."""

    model: dict
    train_batch: int
    train_warmup: int
    train_steps: int
    seq_lens: list[int]
    tokens_per_step: int  # attention benchmark: batch = tokens_per_step / T
    attention_warmup: int
    attention_repeats: int
    new_tokens: int
    e2e_steps: int
    e2e_overrides: list[str] = field(default_factory=list)
    compile_backend: str = "inductor"


def gpu_model_fields() -> dict:
    """ModelConfig fields of configs/gpu.yaml's model section (the optimiser's keys left out)."""
    model = yaml.safe_load((REPO / "configs" / "gpu.yaml").read_text())["model"]
    known = {f.name for f in fields(ModelConfig)} - {"attention"}  # each kind brings its own
    return dict({key: value for key, value in model.items() if key in known}, vocab_size=VOCAB)


def sizes(tiny: bool) -> Sizes:
    model = gpu_model_fields()
    if not tiny:
        return Sizes(model, 64, 3, 20, [1024, 4096, 16384], 16384, 2, 5, model["block_size"] - 1, 300)
    # Five layers, so the mix holds every kind and MTA's convolution layer (2) exists; a context of
    # 80 crosses local attention's 64-token block and MTA's 32-query chunks.
    model = dict(model, n_layer=5, d_model=48, block_size=80)
    shrink = [
        "--model.n_layer",
        "2",
        "--model.d_model",
        "48",
        "--model.block_size",
        "64",
        "--model.compile",
        "false",
    ]
    shrink += ["--trainer.accelerator", "cpu", "--data.batch_size", "4", "--data.num_workers", "0"]
    shrink += ["--data.val_batches", "2"]
    # Inductor's code generation takes tens of seconds per model on a CPU; the eager backend still
    # traces the model with dynamo (graph breaks, guards), which is what goes wrong first.
    return Sizes(model, 2, 1, 2, [32, 64], 64, 0, 1, 12, 4, shrink, compile_backend="eager")


def section_from_config(name: str) -> dict:
    """The attention section of configs/<name>.yaml (mha and mqa: the kind alone)."""
    if name in ("mha", "mqa"):
        return {"kind": name}
    return dict(yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())["model"]["attention"])


def unavailable(name: str) -> str | None:
    """Why `name` of ALL_KINDS cannot run in this checkout (no config file, a kind not registered),
    or None when it can."""
    if name not in ("mha", "mqa") and not (REPO / "configs" / f"{name}.yaml").is_file():
        return f"no configs/{name}.yaml"
    try:
        AttentionConfig(**section_from_config(name))
    except (ValueError, KeyError, TypeError) as error:
        return f"configs/{name}.yaml: {one_line(error, 200)}"
    return None


def available_kinds() -> list[str]:
    return [name for name in ALL_KINDS if unavailable(name) is None]


def attention_sections(n_layer: int, tiny: bool) -> dict[str, dict]:
    """Each available kind's and variant's attention section, from its config file where it has one;
    and the mix."""
    sections = {name: section_from_config(name) for name in available_kinds()}
    if tiny:
        sections["mta"]["options"]["mta"]["query_chunk"] = 32  # several chunks at the tiny context
    order = ["local", "gqa", "mta", "mha", "mqa"]
    mix: dict = {}
    for name in ("gqa", "local", "mta"):  # each kind's settings, its options beside the others'
        mix = merged(mix, **sections[name])
    for kind, variant in MIX_OPTIONS.items():  # each option as its file writes it, on another kind
        if variant in sections:
            options = sections[variant]["options"][sections[variant]["kind"]]
            mix = merged(mix, options={kind: options})
    mix.pop("kind")
    mix["layers"] = [order[i % len(order)] for i in range(n_layer)]
    sections["mix"] = mix
    return sections


def model_config(shape: dict, attention: dict, **changes) -> ModelConfig:
    return ModelConfig(**dict(shape, **changes), attention=AttentionConfig(**attention))


# -- results --------------------------------------------------------------------------------------


class Results:
    def __init__(self, device: torch.device, tiny: bool):
        self.device = device
        self.checks: list[dict] = []
        self.measurements: list[dict] = []
        self.skipped: list[dict] = []
        self.sections: dict[str, float] = {}
        self.tiny = tiny

    def check(self, name: str, kind: str, ok: bool, detail: str, **extra) -> None:
        self.checks.append(dict(name=name, kind=kind, ok=bool(ok), detail=detail, **extra))
        log(f"{'ok  ' if ok else 'FAIL'} {name} [{kind}]: {detail}")

    def measure(self, name: str, kind: str, value, unit: str, **extra) -> None:
        self.measurements.append(dict(name=name, kind=kind, value=value, unit=unit, **extra))
        shown = "n/a" if value is None else f"{value:,.4g}"
        log(f"     {name} [{kind}] {' '.join(f'{k}={v}' for k, v in extra.items())}: {shown} {unit}")

    def skip(self, name: str, kind: str, reason: str) -> None:
        """Work that does not apply to this device: neither a pass nor a failure."""
        self.skipped.append(dict(name=name, kind=kind, detail=reason))
        log(f"skip {name} [{kind}]: {reason}")

    @contextlib.contextmanager
    def guarded(self, name: str, kind: str):
        """A failure inside is a failed check named `name`, not the end of the suite."""
        try:
            yield
        except Exception as error:  # noqa: BLE001 (reported, and the exit status says so)
            self.check(name, kind, False, f"raised {type(error).__name__}: {one_line(error, 400)}")


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16)


@contextlib.contextmanager
def counting_calls(module, *names: str):
    """Count calls of module-level functions `names` of `module` (which its code looks up at call time)."""
    counts = dict.fromkeys(names, 0)
    originals = {name: getattr(module, name) for name in names}

    def counted(name):
        def call(*args, **kwargs):
            counts[name] += 1
            return originals[name](*args, **kwargs)

        return call

    for name in names:
        setattr(module, name, counted(name))
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(module, name, original)


def path_note(config: ModelConfig, device: torch.device, counts: dict | None) -> str:
    """Which implementation the kinds in `config` took on `device`."""
    notes = []
    if counts is not None and "local" in config.layer_kinds:
        notes.append(f"local: flex_local x{counts['flex_local']}, chunked_local x{counts['chunked_local']}")
    if "mta" in config.layer_kinds:
        c_loops = native.available(torch.empty(1, device=device))
        notes.append(f"mta: {'C loops' if c_loops else 'torch operations'}")
    return "; ".join(notes)


# -- checks ---------------------------------------------------------------------------------------


def check_precision(results: Results, kind: str, config: ModelConfig, device: torch.device) -> None:
    reference = verify.perturb_identity_parts(Transformer(config).eval())  # float32, CPU
    model = copy.deepcopy(reference).to(device)
    idx = torch.randint(0, VOCAB, (2, config.block_size))
    with torch.no_grad():
        expected = reference(idx)
        with autocast(device), counting_calls(local, "flex_local", "chunked_local") as counts:
            logits = model(idx.to(device)).float().cpu()
    loss_ref = lm_loss(expected[:, :-1], idx[:, 1:]).item()
    loss = lm_loss(logits[:, :-1], idx[:, 1:]).item()
    spread = (expected - expected.mean(-1, keepdim=True)).pow(2).mean().sqrt()
    rel = ((logits - expected).pow(2).mean().sqrt() / spread).item()
    ok = rel <= PRECISION_TOL["logits_rel_rms"] and abs(loss - loss_ref) <= PRECISION_TOL["loss_abs"]
    flex_expected = device.type == "cuda" and "local" in config.layer_kinds
    if flex_expected and counts["flex_local"] == 0:
        ok = False
    detail = (
        f"bf16 {device.type} vs float32 cpu: loss {loss:.4f} vs {loss_ref:.4f} (|diff| {abs(loss - loss_ref):.2e} "
        f"<= {PRECISION_TOL['loss_abs']}), logits rel. RMS error {rel:.2e} <= {PRECISION_TOL['logits_rel_rms']}"
    )
    note = path_note(config, device, counts)
    results.check("precision", kind, ok, detail + (f"; {note}" if note else ""), value=rel)


def check_causal(results: Results, kind: str, config: ModelConfig, device: torch.device) -> None:
    model = verify.perturb_identity_parts(Transformer(config).eval()).to(device)
    with autocast(device), counting_calls(local, "flex_local", "chunked_local") as counts:
        changed, leak = verify.causality_violation(model, config.block_size)
    ok = changed <= CAUSAL_TOL and leak <= CAUSAL_TOL
    detail = f"bf16 {device.type}, T={config.block_size}: past logits moved {changed:.1e}, gradient from the future {leak:.1e} (<= {CAUSAL_TOL})"
    note = path_note(config, device, counts)
    results.check("causal", kind, ok, detail + (f"; {note}" if note else ""))


def check_cache(results: Results, kind: str, config: ModelConfig, device: torch.device) -> None:
    model = verify.perturb_identity_parts(Transformer(config).eval()).to(device)
    prompt = torch.randint(0, VOCAB, (2, 2), device=device)
    n = config.block_size - prompt.shape[1]
    cached = generate(model, prompt, n, temperature=0)
    uncached = generate(model, prompt, n, temperature=0, use_cache=False)
    same = cached.shape == uncached.shape and torch.equal(cached, uncached)
    # Greedy tokens alone are a weak test of random weights, whose logits lean little on attention:
    # the cache's logits along the sequence must also equal one forward pass over all of it.
    with torch.no_grad():
        full = model(cached)[:, prompt.shape[1] - 1 :].float()
    stepped = verify.cached_logits(model, cached, prompt.shape[1]).float()
    rel = (
        (stepped - full).pow(2).mean().sqrt() / (full - full.mean(-1, keepdim=True)).pow(2).mean().sqrt()
    ).item()
    ok = same and rel <= CACHE_TOL
    if same:
        detail = f"float32 {device.type}: {n} greedy tokens x 2 sequences equal with and without the cache"
    else:
        first = int((cached != uncached).any(0).nonzero()[0])
        detail = f"float32 {device.type}: greedy tokens differ first at position {first} of {cached.shape[1]}"
    detail += f"; cached logits vs one forward pass: rel. RMS error {rel:.1e} <= {CACHE_TOL}"
    results.check("cache", kind, ok, detail, value=rel)


def with_documents(config: ModelConfig) -> ModelConfig:
    """The config with documents starting at token 0; local's global tokens (the sequence's first,
    refused with documents) set to none."""
    attention = config.attention
    if "local" in attention.options and attention.options["local"]["n_global"]:
        attention = attention.with_options("local", n_global=0)
    return dataclasses.replace(config, attention=attention, document_token=DOCUMENT_TOKEN)


def check_documents(results: Results, kind: str, config: ModelConfig, device: torch.device) -> None:
    """[doc A][doc B] at B's positions equals [doc B] alone (bf16 autocast; flex block masks for
    mha/mqa/gqa and local on CUDA)."""
    model = verify.perturb_identity_parts(Transformer(with_documents(config)).eval()).to(device)
    T = config.block_size
    split = T // 3
    idx = torch.randint(1, VOCAB, (2, T), device=device)
    idx[:, 0] = idx[0, split] = idx[1, 2 * split] = DOCUMENT_TOKEN  # the rows split differently
    with torch.no_grad(), autocast(device), counting_calls(local, "flex_documents") as counts:
        packed = model(idx).float()
        alone = [model(idx[row : row + 1, start:]).float()[0] for row, start in ((0, split), (1, 2 * split))]
    gap = max(
        (packed[row, start:] - part).pow(2).mean().sqrt().item() / part.std().item()
        for (row, start), part in zip(((0, split), (1, 2 * split)), alone)
    )
    ok = gap <= PRECISION_TOL["logits_rel_rms"]
    flex = device.type == "cuda" and any(k in config.layer_kinds for k in ("mha", "mqa", "gqa", "local"))
    if flex and counts["flex_documents"] == 0:
        ok = False
    detail = f"bf16 {device.type}, T={T}: a document's logits packed vs alone, rel. RMS {gap:.1e} <= {PRECISION_TOL['logits_rel_rms']}"
    results.check(
        "documents", kind, ok, detail + (f"; flex_documents x{counts['flex_documents']}" if flex else "")
    )


def check_train_step(results: Results, kind: str, config: ModelConfig, device: torch.device) -> None:
    model = verify.perturb_identity_parts(Transformer(config)).to(device).train()
    idx = torch.randint(0, VOCAB, (2, config.block_size + 1), device=device)
    with autocast(device), counting_calls(local, "flex_local", "chunked_local") as counts:
        loss = lm_loss(model(idx[:, :-1]), idx[:, 1:])
    loss.backward()
    params = dict(model.named_parameters())
    missing = [name for name, p in params.items() if p.grad is None]
    bad = [name for name, p in params.items() if p.grad is not None and not torch.isfinite(p.grad).all()]
    ok = math.isfinite(loss.item()) and not missing and not bad
    detail = f"bf16 {device.type}, dropout {config.dropout}: loss {loss.item():.4f}, {len(params)} gradients"
    if missing:
        detail += f"; no gradient: {', '.join(missing[:5])}"
    if bad:
        detail += f"; not finite: {', '.join(bad[:5])}"
    note = path_note(config, device, counts)
    results.check("train step", kind, ok, detail + (f"; {note}" if note else ""))


@contextlib.contextmanager
def ieee_float32():
    """Float32 matrix products and convolutions in full float32 on CUDA (no TF32), restored after."""
    precision = torch.get_float32_matmul_precision()
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(precision)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def with_mta(config: ModelConfig, **options) -> ModelConfig:
    """config without dropout (the kernels have none) and with these MTA options changed."""
    return dataclasses.replace(config, dropout=0.0, attention=config.attention.with_options("mta", **options))


def check_triton(
    results: Results, kind: str, config: ModelConfig, device: torch.device, T: int | None = None
) -> None:
    """config's MTA through the MTA backend triton against conv: same weights, same device, float32.
    T: the sequence length (default a little short of block_size, so the last tiles are ragged)."""
    from minitx.attention.mta.layer import MultiTokenAttention

    T = T or max(1, config.block_size - 5)
    base = verify.perturb_identity_parts(Transformer(with_mta(config, backend="conv"))).eval()
    oracle = copy.deepcopy(base).double()  # float64 on the CPU: how far float32 itself gets
    conv = base.to(device)
    fused = Transformer(with_mta(config, backend="triton")).to(device).eval()
    fused.load_state_dict(conv.state_dict())
    idx = torch.randint(0, VOCAB, (2, T + 1))
    logits, grads, calls = {}, {}, {}
    with ieee_float32():
        for name, model, at in (
            ("float64", oracle, "cpu"),
            ("conv", conv, device),
            ("triton", fused, device),
        ):
            tokens = idx.to(at)
            with counting_calls(MultiTokenAttention, "triton_inputs") as counts:
                out = model(tokens[:, :-1])
            lm_loss(out, tokens[:, 1:]).backward()
            logits[name] = out.detach().double().cpu()
            grads[name] = {
                n: p.grad.double().cpu() for n, p in model.named_parameters() if p.grad is not None
            }
            calls[name] = counts["triton_inputs"]
    reference = logits["conv"]
    spread = (reference - reference.mean(-1, keepdim=True)).pow(2).mean().sqrt()
    rel = ((logits["triton"] - reference).pow(2).mean().sqrt() / spread).item()
    missing = sorted(set(grads["conv"]) ^ set(grads["triton"]))
    worst, worst_excess, bounds, errors = None, -1.0, {}, {}
    for n, g in grads["conv"].items():
        if n not in grads["triton"]:
            continue
        scale = grads["float64"][n].norm().clamp_min(1e-30)
        errors[n] = ((grads["triton"][n] - g).norm() / scale).item()
        own = ((g - grads["float64"][n]).norm() / scale).item()  # conv's own float32 error
        bounds[n] = max(TRITON_TOL, TRITON_NOISE_FACTOR * own)
        if errors[n] / bounds[n] > worst_excess:
            worst, worst_excess = n, errors[n] / bounds[n]
    n_mta = config.layer_kinds.count("mta")
    ok = rel <= TRITON_TOL and worst_excess <= 1 and not missing
    ok = ok and calls["conv"] == 0 and calls["triton"] == n_mta  # each model took the path it names
    detail = (
        f"float32 {device.type} (TF32 off), T={T}, {config.attention.options_of('mta').conv_placement} convolution: "
        f"logits rel. RMS error {rel:.1e} (<= {TRITON_TOL}); closest gradient to its bound: {worst} "
        f"rel. error {errors[worst]:.1e} (<= {bounds[worst]:.1e}), largest {max(errors.values()):.1e}; "
        f"Triton kernels ran in {calls['triton']} of {n_mta} layers (conv model: {calls['conv']})"
    )
    if missing:
        detail += f"; gradient in one model only: {', '.join(missing[:5])}"
    results.check("triton vs conv", kind, ok, detail, value=max(rel, *errors.values()))


def with_gdn(config: ModelConfig, backend: str) -> ModelConfig:
    """config without dropout and with gdn's backend set (auto would pick fla on CUDA when installed)."""
    return dataclasses.replace(
        config, dropout=0.0, attention=config.attention.with_options("gdn", backend=backend)
    )


def check_fla(
    results: Results, kind: str, config: ModelConfig, device: torch.device, documents: bool = False
) -> None:
    """config's gdn layers through fla's Triton kernels (backend fla) against the torch path (backend
    torch): same weights, same device, float32 with TF32 off; logits and every gradient. documents:
    on packed documents, which fla takes as packed sequences (cu_seqlens)."""
    from minitx.attention.gdn import delta_rule

    if documents:
        config = with_documents(config)
    torch_path = Transformer(with_gdn(config, "torch")).to(device).eval()
    fla_path = Transformer(with_gdn(config, "fla")).to(device).eval()
    fla_path.load_state_dict(torch_path.state_dict())
    T = config.block_size - 5  # a partial last chunk
    idx = torch.randint(1, VOCAB, (2, T + 1), device=device)
    if documents:  # row 0: a document from its start and one from a third in; row 1: two thirds in
        idx[0, 0] = idx[0, T // 3] = idx[1, 2 * T // 3] = DOCUMENT_TOKEN
    logits, grads, calls = {}, {}, {}
    with ieee_float32():
        for name, model in (("torch", torch_path), ("fla", fla_path)):
            with counting_calls(delta_rule, "fla_chunk") as counts:
                out = model(idx[:, :-1])
            lm_loss(out, idx[:, 1:]).backward()
            logits[name] = out.detach().double().cpu()
            grads[name] = {
                n: p.grad.double().cpu() for n, p in model.named_parameters() if p.grad is not None
            }
            calls[name] = counts["fla_chunk"]
    reference = logits["torch"]
    spread = (reference - reference.mean(-1, keepdim=True)).pow(2).mean().sqrt()
    rel = ((logits["fla"] - reference).pow(2).mean().sqrt() / spread).item()
    missing = sorted(set(grads["torch"]) ^ set(grads["fla"]))
    errors = {
        n: ((grads["fla"][n] - g).norm() / g.norm().clamp_min(1e-30)).item()
        for n, g in grads["torch"].items()
        if n in grads["fla"]
    }
    worst = max(errors, key=errors.get)
    n_gdn = config.layer_kinds.count("gdn")
    ok = rel <= FLA_TOL and errors[worst] <= FLA_TOL and not missing
    ok = ok and calls["torch"] == 0 and calls["fla"] == n_gdn  # each model took the path it names
    detail = (
        f"float32 {device.type} (TF32 off), T={idx.shape[1] - 1}: logits rel. RMS error {rel:.1e} "
        f"(<= {FLA_TOL}); largest gradient rel. error {errors[worst]:.1e} ({worst}); fla's kernels ran in "
        f"{calls['fla']} of {n_gdn} gdn layers (torch model: {calls['torch']})"
    )
    if missing:
        detail += f"; gradient in one model only: {', '.join(missing[:5])}"
    name = "fla vs torch, documents" if documents else "fla vs torch"
    results.check(name, kind, ok, detail, value=max(rel, errors[worst]))


def train_step(model, step_model, optimizer, x, y, device) -> torch.Tensor:
    """One training step as minitx's trainer takes it (autocast, gradients clipped at 1); step_model
    is model itself or its compiled form. Returns the loss."""
    with autocast(device):
        loss = lm_loss(step_model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss


def muon_losses(config: ModelConfig, device: torch.device, precision: str, steps: int) -> list[float]:
    """The training losses of `steps` steps with Muon (Newton-Schulz in `precision`) and AdamW,
    as train.py builds them, bf16 autocast, from weights and batches fixed by seed 0."""
    torch.manual_seed(0)
    model = Transformer(dataclasses.replace(config, dropout=0.0)).to(device).train()
    params = Parameters.of(model)
    settings = Optimisation(
        optimizer="muon", optimizer_options={"muon": {"precision": precision}}, lr=3e-3, warmup_steps=0
    )
    optimizer = settings.configure(params, steps)["optimizer"]
    generator = torch.Generator().manual_seed(0)
    # A new batch every step, of a walk through a fixed random table (each token has 3 possible
    # successors): something to learn, without fitting a single batch.
    table = torch.randint(0, VOCAB, (VOCAB, 3), generator=generator)
    losses = []
    for _ in range(steps):
        walk = [torch.randint(0, VOCAB, (8,), generator=generator)]
        for _ in range(config.block_size):
            walk.append(table[walk[-1], torch.randint(0, 3, (8,), generator=generator)])
        batch = torch.stack(walk, dim=1).to(device)
        x, y = batch[:, :-1], batch[:, 1:]
        losses.append(train_step(model, model, optimizer, x, y, device).item())
    return losses


def check_muon_precision(results: Results, kind: str, config: ModelConfig, device: torch.device) -> None:
    """Muon's default Newton-Schulz dtype on this device, and bfloat16's losses against float32's."""
    default = muon_dtype("auto", device)
    bf16 = muon_losses(config, device, "bfloat16", MUON_CHECK_STEPS)
    fp32 = muon_losses(config, device, "float32", MUON_CHECK_STEPS)
    difference = abs(bf16[-1] - fp32[-1])
    expected = torch.bfloat16 if device.type == "cuda" else torch.float32
    ok = default == expected and difference <= MUON_PRECISION_TOL and bf16[-1] < bf16[0]
    detail = (
        f"auto is {str(default).removeprefix('torch.')} here; after {MUON_CHECK_STEPS} steps loss "
        f"{bf16[-1]:.4f} (bfloat16) vs {fp32[-1]:.4f} (float32), {difference:.1e} apart "
        f"(tolerance {MUON_PRECISION_TOL}), from {fp32[0]:.4f}"
    )
    results.check("muon precision", kind, ok, detail, value=difference)


def run_checks(results: Results, configs: dict[str, ModelConfig], device: torch.device) -> None:
    for kind, config in configs.items():
        for name, check in (
            ("precision", check_precision),
            ("causal", check_causal),
            ("cache", check_cache),
            ("train step", check_train_step),
            ("documents", check_documents),
        ):
            torch.manual_seed(0)
            with results.guarded(name, kind):
                check(results, kind, config, device)
    if "mha" in configs:
        torch.manual_seed(0)
        with results.guarded("muon precision", "mha"):
            check_muon_precision(results, "mha", configs["mha"], device)
    from minitx.attention.gdn import fla_installed

    for kind, config in configs.items():  # gdn's CUDA fast path: fla's kernels where installed
        if "gdn" not in config.layer_kinds:
            continue
        for name, documents in (("fla vs torch", False), ("fla vs torch, documents", True)):
            if device.type != "cuda" or not fla_installed():
                results.skip(name, kind, FLA_CUDA_ONLY if device.type != "cuda" else NO_FLA)
                continue
            torch.manual_seed(0)
            with results.guarded(name, kind):
                check_fla(results, kind, config, device, documents)
    if "mta" not in configs:
        return
    # The released setting (configs/mta.yaml: pre and post convolutions) and the pre-softmax
    # convolution alone: the kernels' two shapes (with and without the post-softmax halo).
    for kind, config in (
        ("mta", configs["mta"]),
        ("mta (pre only)", with_mta(configs["mta"], conv_placement="pre")),
    ):
        if device.type != "cuda":
            results.skip("triton vs conv", kind, CUDA_ONLY)
            continue
        torch.manual_seed(0)
        with results.guarded("triton vs conv", kind):
            check_triton(results, kind, config, device)


# -- measurements ---------------------------------------------------------------------------------


def training_speed(
    config: ModelConfig, device: torch.device, size: Sizes, compiled: bool
) -> tuple[float, int]:
    """(tokens/s, graph breaks) of a bare training loop: bf16 autocast, AdamW, gradient clipping at 1.
    Graph breaks (compiled only) split the model into several compiled pieces, each a cost."""
    model = Transformer(config).to(device).train()
    optimizer = torch.optim.AdamW(
        optimizer_groups(list(model.named_parameters()), 0.1), lr=1e-3, fused=device.type == "cuda"
    )
    if compiled:
        torch._dynamo.reset()  # each model its own graphs, far from the recompile limit
        torch._dynamo.utils.counters.clear()
    step_model = torch.compile(model, backend=size.compile_backend) if compiled else model
    idx = torch.randint(0, VOCAB, (size.train_batch, config.block_size + 1), device=device)
    x, y = idx[:, :-1], idx[:, 1:]
    start = None
    for step in range(size.train_warmup + size.train_steps):
        if step == size.train_warmup:
            sync(device)
            start = time.perf_counter()
        train_step(model, step_model, optimizer, x, y, device)
    sync(device)
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values()) if compiled else 0
    return size.train_steps * x.numel() / (time.perf_counter() - start), breaks


def measure_training(results: Results, configs: dict[str, ModelConfig], device: torch.device, size: Sizes):
    peak = peak_flops(device)
    for kind, config in configs.items():
        flops = Transformer(config).flops_per_token(config.block_size)
        for compiled in (False, True) if kind in COMPILED_TRAINING_KINDS else (False,):
            label = "compiled" if compiled else "eager"
            with results.guarded(f"train {label}", kind):
                tokens_per_sec, breaks = training_speed(config, device, size, compiled)
                results.measure("train tokens/s", kind, tokens_per_sec, "tokens/s", compiled=compiled)
                if compiled:
                    results.measure("train graph breaks", kind, breaks, "breaks", compiled=compiled)
                mfu = None if peak is None else 100 * flops * tokens_per_sec / peak
                results.measure("train MFU", kind, mfu, "%", compiled=compiled)
        with results.guarded("train eager with documents", kind):
            # Random tokens: a document starts at token 0, on average every VOCAB tokens.
            with_docs, _ = training_speed(with_documents(config), device, size, compiled=False)
            results.measure("train tokens/s with documents", kind, with_docs, "tokens/s", compiled=False)
            if device.type == "cuda":
                torch.cuda.empty_cache()


def attention_variants(
    sections: dict[str, dict], device: torch.device, kinds: list[str] | None = None
) -> dict[str, dict]:
    """The attention section's rows: name -> attention settings. On CUDA auto would take the Triton
    kernels for MTA, so `mta (torch)` keeps the torch path it took before them (benchmarks/attention.py's
    TORCH_AUTO) and the kernels have their own rows. The 2024-25 variants follow, those of `kinds`
    (None: every one in sections) by their config files' names."""
    released = merged(
        sections["mta"], options={"mta": {"conv_layers": [0]}}
    )  # the released layer, convolving
    cuda = device.type == "cuda"
    variants = {
        "mha (SDPA)": sections["mha"],
        "local (flex)" if cuda else "local (chunked)": sections["local"],
        "local-dense": sections["local"],
    }
    if not cuda:
        variants["mta"] = released  # auto: the C loops or torch
    else:
        variants["mta (torch)"] = merged(released, options={"mta": {"backend": attention_bench.TORCH_AUTO}})
        variants["mta-triton"] = merged(
            released, options={"mta": {"conv_placement": "pre", "backend": "triton"}}
        )
        variants["mta-both-triton"] = merged(released, options={"mta": {"backend": "triton"}})
    for name in VARIANTS:
        if name in sections and (kinds is None or name in kinds):
            variants[name] = sections[name]
    return variants


def attention_ratios(results: Results, T: int, batch: int, ms: dict, peak: dict) -> None:
    """Each triton row's time and peak memory over mha's at T, and the goal's check at GOAL_SEQ_LENS.
    A row that did not run is a failed goal, not an error."""
    for name in TRITON_ROWS:
        ratio = ms[name] / ms["mha (SDPA)"] if name in ms and "mha (SDPA)" in ms else None
        memory = peak[name] / peak["mha (SDPA)"] if name in peak and "mha (SDPA)" in peak else None
        results.measure("attention fwd+bwd / mha", name, ratio, "x", T=T, batch=batch)
        results.measure("attention peak memory / mha", name, memory, "x", T=T, batch=batch)
        if T not in GOAL_SEQ_LENS:
            continue
        if ratio is None:
            detail = f"T={T}, bf16: not measured (see the failed attention check of T={T})"
        else:
            detail = (
                f"T={T}, bf16, batch {batch}: {ms[name]:.2f} ms / mha {ms['mha (SDPA)']:.2f} ms = {ratio:.2f} "
                f"(goal <= {ATTENTION_GOAL}); peak {peak.get(name, float('nan')):.0f} MiB, "
                f"{memory if memory is not None else float('nan'):.2f}x mha's"
            )
        ok = ratio is not None and ratio <= ATTENTION_GOAL
        results.check("attention goal", name, ok, detail, value=ratio)


def measure_attention(
    results: Results,
    sections: dict[str, dict],
    device: torch.device,
    size: Sizes,
    kinds: list[str] | None = None,
):
    shape = size.model
    variants = attention_variants(sections, device, kinds)
    if device.type != "cuda":
        results.skip("attention", ", ".join(TRITON_ROWS), CUDA_ONLY)
    for T in size.seq_lens:
        args = argparse.Namespace(
            device=device.type,
            dtype="bfloat16",
            batch=max(1, size.tokens_per_step // T),
            n_head=shape["n_head"],
            d_model=shape["d_model"],
            warmup=size.attention_warmup,
            repeats=size.attention_repeats,
            cpu_time=False,  # the wall clock, synchronised: the GPU's time
        )
        layers = {}
        for name, attention in variants.items():
            with results.guarded(f"attention {name} T={T}", name):
                layers[name] = attention_bench.make_layer(name.split(" ")[0], attention, T, args)
        # The triton rows are timed by themselves: a kernel that fails loses its own rows only.
        groups = [[n for n in layers if n not in TRITON_ROWS], [n for n in layers if n in TRITON_ROWS]]
        ms, peak = {}, {}
        for group, label in zip(groups, ("all", "triton")):
            if not group:
                continue
            with results.guarded(f"attention T={T}", label):
                for name, median in attention_bench.median_ms({n: layers[n] for n in group}, args).items():
                    peak[name], _ = attention_bench.memory_mib(*layers[name], args)
                    ms[name] = median
                    results.measure("attention fwd+bwd", name, median, "ms", T=T, batch=args.batch)
                    results.measure("attention peak memory", name, peak[name], "MiB", T=T, batch=args.batch)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if device.type == "cuda":
            attention_ratios(results, T, args.batch, ms, peak)
        for name in VARIANTS:  # the variants' time and memory over mha's: measured, no goal here
            if name in ms and "mha (SDPA)" in ms:
                extra = dict(T=T, batch=args.batch)
                results.measure("attention fwd+bwd / mha", name, ms[name] / ms["mha (SDPA)"], "x", **extra)
                memory = peak[name] / peak["mha (SDPA)"]
                results.measure("attention peak memory / mha", name, memory, "x", **extra)
        del layers
        if device.type == "cuda":
            torch.cuda.empty_cache()


def decoding_speed(
    model: Transformer,
    device: torch.device,
    new_tokens: int,
    use_cache: bool,
    compile_backend: str | None = None,
) -> float:
    """Greedy tokens/s of one row from a one-token prompt; with `compile_backend`, of
    torch.compile(model), whose first generation of the same length (compiling every graph
    decoding needs) is the warm-up."""
    prompt = torch.zeros(1, 1, dtype=torch.long, device=device)
    if compile_backend is not None:
        torch._dynamo.reset()  # each model its own graphs, far from the recompile limit
        model = torch.compile(model, backend=compile_backend)
    generate(model, prompt, new_tokens if compile_backend else 8, temperature=0, use_cache=use_cache)
    sync(device)
    start = time.perf_counter()
    generate(model, prompt, new_tokens, temperature=0, use_cache=use_cache)
    sync(device)
    return new_tokens / (time.perf_counter() - start)


def measure_decoding(results: Results, configs: dict[str, ModelConfig], device: torch.device, size: Sizes):
    for kind, config in configs.items():
        with results.guarded("decode", kind):
            model = Transformer(config).to(device).eval()
            cached = decoding_speed(model, device, size.new_tokens, use_cache=True)
            uncached = decoding_speed(model, device, size.new_tokens, use_cache=False)
            extra = dict(batch=1, new_tokens=size.new_tokens, dtype="float32")
            results.measure("decode tokens/s with cache", kind, cached, "tokens/s", **extra)
            results.measure("decode tokens/s without cache", kind, uncached, "tokens/s", **extra)
            results.measure("decode speed-up of the cache", kind, cached / uncached, "x", **extra)
            if kind in COMPILED_DECODING_KINDS:
                compiled = decoding_speed(model, device, size.new_tokens, True, size.compile_backend)
                results.measure(
                    "decode tokens/s with cache, compiled", kind, compiled, "tokens/s", **extra,
                    backend=size.compile_backend,
                )  # fmt: skip


# A run of ablate's as the GPU sweep check launches it: says which GPUs it saw and which one it
# used, and holds its GPU for a moment so that runs launched together overlap.
SWEEP_RUN = r"""
import json, os, sys, time, torch
directory = sys.argv[1]
visible = torch.cuda.device_count()
uuid = str(torch.cuda.get_device_properties(0).uuid) if visible else None
x = torch.ones(1, device="cuda") if visible else None
time.sleep(2)
json.dump({"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "count": visible, "uuid": uuid,
           "device": "cuda:0" if visible else "cpu"}, open(os.path.join(directory, "summary.json"), "w"))
"""


def check_sweep_devices(results: Results, out: Path, device: torch.device) -> None:
    """ablate --parallel on this machine's GPUs (minitx/ablation/runs/launch.py): as many runs as
    GPUs, launched together; each must see exactly one GPU, its own, and no two the same one."""
    if device.type != "cuda":
        results.skip(
            "sweep devices",
            "ablate",
            "skipped: CUDA only (on a machine without GPUs ablate --parallel runs as before)",
        )
        return
    from minitx.ablation.plan.sweep import Variant
    from minitx.ablation.runs.launch import local_launcher, visible_gpus
    from minitx.ablation.runs.runner import Run

    gpus = visible_gpus()
    root = out / "sweep_devices"
    runs = [
        Run(
            Variant(f"gpu{i}", {}),
            0,
            root / f"run{i}",
            [sys.executable, "-c", SWEEP_RUN, str(root / f"run{i}")],
            "",
        )
        for i in range(max(2, len(gpus)))
    ]
    said: list[str] = []
    local_launcher(len(runs), None, log=said.append).launch(runs, root, said.append)
    (root / "ablate.log").write_text("\n".join(said) + "\n")
    seen = [json.loads((run.directory / "summary.json").read_text()) for run in runs]
    given = [json.loads((run.directory / "run.json").read_text()).get("gpus") for run in runs]
    owned = {s["uuid"] for s in seen}
    ok = all(s["count"] == 1 and [s["visible"]] == g for s, g in zip(seen, given)) and len(owned) == min(
        len(runs), len(gpus)
    )
    results.check(
        "sweep devices",
        "ablate",
        ok,
        f"{len(runs)} runs on {len(gpus)} GPU(s): given {[','.join(g or []) for g in given]}, each saw "
        f"{sorted({s['count'] for s in seen})} device(s), {len(owned)} distinct GPU(s) used"
        + (f"; {said[0]}" if said and "cut to" in said[0] else ""),
    )


def measure_end_to_end(results: Results, out: Path, device: torch.device, size: Sizes) -> None:
    root = out / "e2e"
    shutil.rmtree(root, ignore_errors=True)  # this suite's own run from an earlier call
    command = [sys.executable, str(REPO / "train.py"), "--config", str(REPO / "configs" / "gpu.yaml")]
    command += [
        "--trainer.max_steps",
        str(size.e2e_steps),
        "--trainer.val_check_interval",
        str(size.e2e_steps),
    ]
    command += ["--run.root", str(root), "--run.name", "gpu", "--run.sample_tokens", "0"]
    command += ["--run.checkpoint_every_n_steps", str(size.e2e_steps), *size.e2e_overrides]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - start
    (out / "e2e.log").write_text(done.stdout + done.stderr)
    found = re.search(r"final val loss ([\d.]+)", done.stdout)
    ok = done.returncode == 0 and found is not None and math.isfinite(float(found.group(1)))
    tail = one_line((done.stderr or done.stdout)[-300:])
    detail = (
        f"train.py --config configs/gpu.yaml, {size.e2e_steps} steps: exit status {done.returncode}"
        + (f", final val loss {found.group(1)}" if found else f"; {tail}")
        + f"; log in {out.name}/e2e.log"
    )
    results.check("end to end", "mha", ok, detail)
    if found:
        results.measure("e2e val loss", "mha", float(found.group(1)), "nats", steps=size.e2e_steps)
    results.measure("e2e wall time", "mha", wall, "s", steps=size.e2e_steps)


# -- report ---------------------------------------------------------------------------------------


def value_of(measurements: list[dict], name: str, kind: str, **extra):
    for m in measurements:
        if m["name"] == name and m["kind"] == kind and all(m.get(k) == v for k, v in extra.items()):
            return m["value"]
    return None


def targets(results: Results, size: Sizes) -> list[dict]:
    """The issue's targets on one H100, evaluated on whatever ran (meaningful on a GPU only)."""
    m = results.measurements
    rows = []

    def add(name: str, value, goal: str, met):
        rows.append(dict(name=name, value=value, target=goal, met=None if value is None else bool(met)))

    mha = value_of(m, "train tokens/s", "mha", compiled=True)
    add("mha training tokens/s, compiled", mha, ">= 1,000,000", mha is not None and mha >= 1e6)
    mta = value_of(m, "train tokens/s", "mta", compiled=True)
    ratio = None if mha is None or mta is None else mta / mha
    add("mta / mha training tokens/s, compiled", ratio, ">= 0.333", ratio is not None and ratio >= 1 / 3)
    local_name = "local (flex)" if results.device.type == "cuda" else "local (chunked)"
    for T in size.seq_lens:
        flex, dense = (value_of(m, "attention fwd+bwd", n, T=T) for n in (local_name, "local-dense"))
        speedup = None if flex is None or dense is None else dense / flex
        add(f"local-dense / {local_name} time, T={T}", speedup, "> 1", speedup is not None and speedup > 1)
    for name in TRITON_ROWS:
        for T in size.seq_lens:
            if T in GOAL_SEQ_LENS:
                ratio = value_of(m, "attention fwd+bwd / mha", name, T=T)
                goal = f"<= {ATTENTION_GOAL}"
                add(f"{name} / mha time, T={T}", ratio, goal, ratio is not None and ratio <= ATTENTION_GOAL)
        # The same tokens per step at every T: memory linear in T stays flat, quadratic grows as T.
        short, long = min(size.seq_lens), max(size.seq_lens)
        first, last = (value_of(m, "attention peak memory", name, T=T) for T in (short, long))
        growth = None if first is None or last is None else last / first
        add(
            f"{name} peak memory, T={long} / T={short} (same tokens per step)",
            growth,
            "<= 1.5 (linear in T)",
            growth is not None and growth <= 1.5,
        )
    for kind in VARIANTS:
        # The variants' goal: a training step within TRAIN_GOAL x mha's, like against like.
        compiled = kind in COMPILED_TRAINING_KINDS
        mha, variant = (value_of(m, "train tokens/s", k, compiled=compiled) for k in ("mha", kind))
        ratio = None if mha is None or variant is None else variant / mha
        goal = f">= {1 / TRAIN_GOAL:.2f} (a step <= {TRAIN_GOAL}x mha's)"
        label = "compiled" if compiled else "eager"
        add(
            f"{kind} / mha training tokens/s, {label}",
            ratio,
            goal,
            ratio is not None and ratio >= 1 / TRAIN_GOAL,
        )
    for kind in ALL_KINDS:
        speedup = value_of(m, "decode speed-up of the cache", kind)
        add(f"decoding speed-up of the cache, {kind}", speedup, ">= 5", speedup is not None and speedup >= 5)
    for name in ("decode tokens/s with cache", "decode tokens/s with cache, compiled"):
        mha, mta = (value_of(m, name, kind) for kind in ("mha", "mta"))
        ratio = None if mha is None or mta is None else mta / mha
        goal = f">= {DECODE_GOAL}"
        add(
            f"mta / mha {name.replace('decode', 'decoding')}",
            ratio,
            goal,
            ratio is not None and ratio >= DECODE_GOAL,
        )
    return rows


def markdown(report: dict) -> str:
    ok = sum(c["ok"] for c in report["checks"])
    lines = [
        f"# GPU suite: {report['device']}",
        "",
        f"torch {report['torch']} (CUDA {report['cuda']}), lightning {report['lightning']}, Python {report['python']}, "
        f"{report['date']}{', --tiny' if report['tiny'] else ''}; {report['elapsed_s']:.0f} s.",
        "",
        f"## Checks: {ok} of {len(report['checks'])} pass",
        "",
        "| check | kind | ok | detail |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {c['name']} | {c['kind']} | {'yes' if c['ok'] else '**NO**'} | {c['detail']} |"
        for c in report["checks"]
    ]
    if report["skipped"]:
        lines += ["", "Not run on this device:", ""]
        lines += [f"- {s['name']} [{s['kind']}]: {s['detail']}" for s in report["skipped"]]
    lines += [
        "",
        "## Measurements",
        "",
        "| measurement | kind | setting | value | unit |",
        "|---|---|---|---:|---|",
    ]
    for m in report["measurements"]:
        setting = ", ".join(f"{k}={v}" for k, v in m.items() if k not in ("name", "kind", "value", "unit"))
        value = "n/a" if m["value"] is None else f"{m['value']:,.4g}"
        lines.append(f"| {m['name']} | {m['kind']} | {setting} | {value} | {m['unit']} |")
    lines += ["", "## Targets (one H100, bf16)", "", "| target | value | goal | met |", "|---|---:|---|---|"]
    for t in report["targets"]:
        value = "not run" if t["value"] is None else f"{t['value']:,.4g}"
        met = "n/a" if t["met"] is None else ("yes" if t["met"] else "no")
        lines.append(f"| {t['name']} | {value} | {t['target']} | {met} |")
    lines += [
        "",
        "Section times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in report["section_s"].items()),
        "",
    ]
    return "\n".join(lines)


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"


# -- command --------------------------------------------------------------------------------------


def parse_args(argv) -> argparse.Namespace:
    parser = ArgumentParser(
        prog="benchmarks/gpu.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("--out", required=True, type=Path, help="directory for results.json and results.md")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="default cuda")
    parser.add_argument("--tiny", action="store_true", help="toy sizes: the same code in seconds")
    parser.add_argument(
        "--only", nargs="+", choices=SECTIONS, metavar="SECTION", help=f"a subset of {' '.join(SECTIONS)}"
    )
    parser.add_argument(
        "--kinds",
        nargs="+",
        choices=[*ALL_KINDS, "mix"],
        metavar="KIND",
        help=f"a subset of {' '.join(ALL_KINDS)} mix (default: every one available here)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError(
            "--device cuda: no CUDA device is visible to torch; use --device cpu (with --tiny for a quick run)"
        )
    for kind in args.kinds or ():
        why = unavailable(kind) if kind != "mix" else None
        if why is not None:
            raise UserError(f"--kinds: {kind} is not available in this checkout ({why})")
    if args.out.exists() and not args.out.is_dir():
        raise UserError(f"--out: {args.out} exists and is not a directory")
    return args


def run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    size = sizes(args.tiny)
    sections = attention_sections(size.model["n_layer"], args.tiny)
    chosen = args.kinds or [name for name in sections if name in ALL_KINDS] + ["mix"]
    results = Results(device, args.tiny)
    configs = {}
    for kind in chosen:  # a kind that rejects this model's shape is a failed check, not the end
        with results.guarded("config", kind):
            configs[kind] = model_config(size.model, sections[kind])
    kind_configs = {kind: config for kind, config in configs.items() if kind != "mix"}
    if args.kinds is None:  # a variant still being written is listed, not silently left out
        for name in ALL_KINDS:
            if name not in sections:
                results.skip("every section", name, f"not available in this checkout: {unavailable(name)}")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    steps = {
        "checks": lambda: run_checks(results, configs, device),
        "train": lambda: measure_training(results, kind_configs, device, size),
        "attention": lambda: measure_attention(results, sections, device, size, chosen),
        "decode": lambda: measure_decoding(results, kind_configs, device, size),
        "e2e": lambda: (
            check_sweep_devices(results, args.out, device),
            measure_end_to_end(results, args.out, device, size),
        ),
    }
    for section in args.only or SECTIONS:
        log(f"== {section} ({time.perf_counter() - started:.0f} s)")
        torch.manual_seed(args.seed)
        section_start = time.perf_counter()
        with results.guarded(section, "all"):
            steps[section]()
        results.sections[section] = time.perf_counter() - section_start
    import lightning

    report = dict(
        device=machine(device),
        device_type=device.type,
        torch=torch.__version__,
        cuda=torch.version.cuda,
        lightning=lightning.__version__,
        python=platform.python_version(),
        date=datetime.date.today().isoformat(),
        tiny=args.tiny,
        elapsed_s=time.perf_counter() - started,
        section_s=results.sections,
        tolerances=dict(
            precision=PRECISION_TOL,
            causal=CAUSAL_TOL,
            cache=CACHE_TOL,
            triton=TRITON_TOL,
            attention_goal=ATTENTION_GOAL,
            muon_precision=MUON_PRECISION_TOL,
        ),
        ok=all(c["ok"] for c in results.checks),
        checks=results.checks,
        skipped=results.skipped,
        measurements=results.measurements,
    )
    report["targets"] = targets(results, size)
    (args.out / "results.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "results.md").write_text(markdown(report))
    return report


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
    except UserError as error:
        print(f"benchmarks/gpu.py: {one_line(error)}", file=sys.stderr)
        return 2
    report = run(args)
    failed = [c for c in report["checks"] if not c["ok"]]
    log(
        f"{len(report['checks']) - len(failed)} of {len(report['checks'])} checks pass; {args.out / 'results.md'}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
