"""The checks of `python -m minitx.verify FILE`: what minitx's tests hold its own kinds to, made on
a kind of the user's own, each a line that says ok or the one thing wrong.

Each check takes a tiny model with every layer of the kind (`tiny_config`), whose kind parameters
are moved away from their initialisation (probe.perturbed), and returns what it found: a Result
that passed (with what it measured) or failed (with the problem). An exception raised inside the
check is its failure, named by the line of the user's file it was raised in where there is one.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..attention.kind_layer import KindLayer
from ..attention.softmax import Attention
from ..config import AttentionConfig, ModelConfig
from ..decoding.loop import generate
from ..errors import UserError, one_line, raised_in
from ..kinds import KindSpec, outside_kind_files
from ..model import Transformer
from . import cached_logits, changed_logits_before, gradient_from_future, probe_positions
from .probe import ProbedLayers, first_leak, one_thread, perturbed

VOCAB, BLOCK, LAYERS = 29, 24, 2
LENGTHS = (1, 7, 23)  # 1, and lengths that are no multiple of anything
GRADIENT_LENGTH = 13
# float32: the fast path against the maths, cached against uncached, and what a future token may
# move (nothing, but the rounding of a kind that mixes positions in floating point, an FFT's)
EXACT = 1e-5


@dataclass(frozen=True)
class Result:
    name: str
    ok: bool
    detail: str  # what was measured (ok) or the one thing wrong

    def line(self) -> str:
        return f"{self.name}: {'ok' if self.ok else 'FAILED'}: {self.detail}"


def tiny_config(spec: KindSpec, options: dict) -> ModelConfig:
    """A model of LAYERS layers of the kind, at its default options changed by `options`."""
    attention = AttentionConfig(kind=spec.name, options={spec.name: options} if options else {})
    return ModelConfig(
        vocab_size=VOCAB, block_size=BLOCK, n_layer=LAYERS, n_head=4, d_model=32, attention=attention
    )


@one_thread()
def check_kind(spec: KindSpec, options: dict) -> list[Result]:
    """Every check of the kind, in the order they are printed; a kind that does not build gets one."""
    torch.manual_seed(0)
    built = attempt("options", lambda: check_options(spec, options))
    if not built.ok:
        return [built]
    model = Transformer(tiny_config(spec, options)).eval()
    perturbed(block.attn for block in model.blocks)
    checks: list[tuple[str, Callable[[], str]]] = [
        ("causality", lambda: check_causality(model)),
        ("reference", lambda: check_reference(model)),
        ("cached decode", lambda: check_cached(model)),
        ("generation", lambda: check_generation(model)),
        ("gradient step", lambda: check_gradient_step(copy.deepcopy(model))),
    ]
    return [built, *(attempt(name, check) for name, check in checks)]


class Failed(Exception):
    """A check's one thing wrong."""


def attempt(name: str, check: Callable[[], str]) -> Result:
    try:
        return Result(name, True, check())
    except (Failed, UserError) as failure:  # UserError: the kind's own check of its options
        return Result(name, False, str(failure))
    except Exception as error:  # the kind's code raised: where, in the user's file if it passed through it
        where = raised_in(error, outside_kind_files())
        return Result(name, False, where or f"{type(error).__name__}: {one_line(error, 300)}")


def check_options(spec: KindSpec, options: dict) -> str:
    """The options build (defaults, or as given) into a model, and are plain values, as a
    checkpoint saves them and loads them back (weights_only: no objects of the user's classes)."""
    config = tiny_config(spec, options)
    Transformer(config)
    values = config.attention.options.get(spec.name, {})
    for option, value in values.items():
        if not is_plain(value):
            raise Failed(
                f"option {option} is {value!r}, which a checkpoint cannot hold; give it a number, text, "
                "true/false, a list of those or None"
            )
    return ", ".join(f"{k}={v!r}" for k, v in values.items()) or "the kind has no options"


def is_plain(value) -> bool:
    if isinstance(value, (list, tuple)):
        return all(is_plain(item) for item in value)
    return value is None or isinstance(value, (bool, int, float, str))


def check_causality(model: Transformer) -> str:
    """No future token moves an earlier layer output or logit (cuts at 1, the middle and the end),
    and no gradient of an output reaches a later token's embedding; the layer and position named
    when one does."""
    layers = ProbedLayers(model.config, {i: block.attn for i, block in enumerate(model.blocks)}, model.rope)
    for T in LENGTHS[1:]:
        if (leak := first_leak(layers, T)) is not None:
            raise Failed(
                f"in layer {leak.layer} a future token changes the output at position {leak.position} by "
                f"{leak.change:.3g}; hide from each query the keys after it (is_causal=True in attend)"
            )
        idx = torch.randint(0, VOCAB, (2, T))
        changed = max(changed_logits_before(model, idx, t) for t in (1, T // 2, T - 1))
        if changed > EXACT:
            raise Failed(f"a future token changes an earlier logit by {changed:.3g} (T = {T})")
    idx = torch.randint(0, VOCAB, (2, GRADIENT_LENGTH))
    leak = gradient_from_future(model, idx, probe_positions(model, GRADIENT_LENGTH))
    if leak > EXACT:
        raise Failed(f"the gradient of an output reaches a later token's embedding ({leak:.3g})")
    return f"no future token moves an earlier output or gradient (T = {', '.join(map(str, LENGTHS[1:]))})"


def check_reference(model: Transformer) -> str:
    """attend(q, k, v) equals reference(q, k, v)'s output, where the kind has both."""
    layer = model.blocks[0].attn
    if not isinstance(layer, Attention) or type(layer).reference is KindLayer.reference:
        return "no reference(q, k, v) to hold the fast path to (attention maps need one)"
    worst = 0.0
    for T in LENGTHS:
        q = torch.randn(2, layer.n_head, T, layer.head_dim)
        k, v = (torch.randn(2, layer.n_kv_head, T, layer.head_dim) for _ in range(2))
        with torch.no_grad():
            fast, (exact, _weights) = layer.attend(q, k, v), layer.reference(q, k, v)
        worst = max(worst, (fast - exact).abs().max().item())
        if not worst <= EXACT:
            raise Failed(f"attend differs from reference by {worst:.3g} at T = {T}")
    return f"attend equals reference within {worst:.1g} (T = {', '.join(map(str, LENGTHS))})"


def check_cached(model: Transformer) -> str:
    """Decoding through the cache (a prompt, then one token a step) equals the full forward."""
    seq = torch.randint(0, VOCAB, (2, BLOCK))
    prompt = 5
    with torch.no_grad():
        full = model(seq)[:, prompt - 1 :]
    moved = (cached_logits(model, seq, prompt) - full).abs().amax(dim=(0, 2))
    if not moved.max() <= EXACT:
        position = int((moved > EXACT).nonzero()[0]) + prompt - 1
        raise Failed(
            f"the cached logits differ from the full forward's by {moved.max():.3g}, first at position "
            f"{position} (attend_cached, or what the cache keeps)"
        )
    return f"prefill of {prompt} tokens, then one a step, equals the full forward within {moved.max():.1g}"


def check_generation(model: Transformer) -> str:
    """Greedy decoding gives the same tokens with the cache and without; sampling goes past the context."""
    prompt = torch.randint(0, VOCAB, (2, 3))
    new, past = 12, BLOCK + 4
    cached = generate(model, prompt, new, temperature=0)  # generate runs under inference_mode
    plain = generate(model, prompt, new, temperature=0, use_cache=False)
    if not torch.equal(cached, plain):
        position = int((cached != plain).any(0).nonzero()[0])
        raise Failed(f"greedy tokens differ with and without the cache from position {position}")
    generate(model, prompt, past, temperature=1.0)
    return f"{new} greedy tokens equal with and without the cache; {past} sampled, past the context"


def check_gradient_step(model: Transformer) -> str:
    """A training step: a finite loss, a gradient for every parameter of the kind, a finite loss after."""
    model.train()
    x, y = torch.randint(0, VOCAB, (2, 2, BLOCK))
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    if not math.isfinite(loss.item()):
        raise Failed(f"the loss is {loss.item()}")
    loss.backward()
    kind_parameters = [(n, p) for n, p in model.named_parameters() if ".attn." in n]
    if without := [n for n, p in kind_parameters if p.grad is None or not p.grad.any()]:
        raise Failed(f"no gradient reaches {', '.join(without)} (used in forward? detached?)")
    if broken := [n for n, p in kind_parameters if not torch.isfinite(p.grad).all()]:
        raise Failed(f"the gradient of {', '.join(broken)} is not finite")
    with torch.no_grad():
        for param in model.parameters():
            if param.grad is not None:
                param -= 1e-2 * param.grad
    after = F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
    if not math.isfinite(after):
        raise Failed(f"the loss after one step is {after}")
    return f"loss {loss.item():.3f} -> {after:.3f}; all {len(kind_parameters)} of the kind's parameters get a gradient"
