"""Properties every model must have, measured on any device: the tests and benchmarks/gpu.py share them.

Causality is measured two ways: (1) changing the tokens at positions >= t must leave the logits
before t unchanged; (2) the gradient of the logits at position i with respect to the input
embedding at any j > i must be exactly zero. Both return the largest violation found (0.0 for a
causal model), so a caller picks its own tolerance.

`cached_logits` runs a sequence through the KV cache the way generation does, for comparison with
one forward pass over the whole sequence.

`perturb_identity_parts` moves MTA's parts away from their identity initialisation: an untrained
MTA layer equals plain attention, so a wrong convolution or head mix would otherwise not show.

Beside these: probe.py, the causality probe the commands make of every kind from outside minitx
when they build a model; `python -m minitx.verify FILE` (__main__.py, its checks in
kind_check.py), the check of a kind of one's own.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..attention.local import MIN_BLOCK
from ..decoding.loop import CachedSteps
from ..model import Transformer

# Parameters that start as the identity (MTA's kernels, head mixes, output norm and gate).
IDENTITY_PARTS = ("kq_conv", "mix_pre", "mix_post", "attn.norm.", "attn.gate.")


@torch.no_grad()
def perturb(params: Iterable[torch.nn.Parameter]) -> None:
    """Add noise of scale 1/sqrt(fan-in) to each of the parameters."""
    for param in params:
        fan_in = param[0].numel() if param.dim() > 1 else 1
        param.add_(torch.randn_like(param) / fan_in**0.5)


def perturb_identity_parts(model: Transformer) -> Transformer:
    """perturb every parameter that starts as the identity; returns the model."""
    perturb(p for name, p in model.named_parameters() if any(part in name for part in IDENTITY_PARTS))
    return model


def changed_logits_before(model: Transformer, idx: torch.Tensor, t: int) -> float:
    """Largest change of logits at positions < t when every token at positions >= t changes."""
    if t == 0:
        return 0.0
    vocab = model.config.vocab_size
    other = idx.clone()
    shift = torch.randint(1, vocab, idx[:, t:].shape, device=idx.device)
    other[:, t:] = (idx[:, t:] + shift) % vocab
    with torch.no_grad():
        before, after = model(idx)[:, :t], model(other)[:, :t]
    return (before.float() - after.float()).abs().max().item()


def gradient_from_future(model: Transformer, idx: torch.Tensor, positions) -> float:
    """Largest |d logits[i] / d embedding[j]| over j > i, for each probed position i."""
    x = model.embed(idx).detach().requires_grad_()
    logits = model.forward_embeddings(x)
    leak = 0.0
    for i in positions:
        direction = torch.randn_like(logits[:, i])  # a random cotangent: no lucky cancellation
        (grad,) = torch.autograd.grad((logits[:, i] * direction).sum(), x, retain_graph=True)
        assert grad[:, i].abs().max() > 0, "the checker must see the token's own influence"
        if i + 1 < idx.shape[1]:
            leak = max(leak, grad[:, i + 1 :].abs().max().item())
    return leak


def probe_positions(model: Transformer, T: int) -> list[int]:
    """Where to take gradients: both ends, the middle, and either side of the edges where the
    kinds cut a sequence (local attention's blocks, MTA's query chunks), which a backward pass
    recomputes chunk by chunk; not every position, which would cost T backward passes."""
    edges = {T // 2, MIN_BLOCK, 2 * MIN_BLOCK}
    for block in model.blocks:
        if chunk := getattr(block.attn, "query_chunk", None):
            edges |= {chunk, 2 * chunk}
    probes = {0, 1, T - 2, T - 1} | {e + d for e in edges for d in (-1, 0, 1)}
    return sorted(p for p in probes if 0 <= p < T)


def causality_violation(model: Transformer, T: int, batch: int = 2) -> tuple[float, float]:
    """(largest logit change before the cut, largest gradient from the future); both 0 if causal.
    Random tokens on the model's device; cuts at both ends, the middle and local attention's block
    edge. Runs under whatever autocast the caller set up."""
    device = next(model.parameters()).device
    idx = torch.randint(0, model.config.vocab_size, (batch, T), device=device)
    changed = max(changed_logits_before(model, idx, t) for t in sorted({0, T // 2, MIN_BLOCK % T, T - 1}))
    return changed, gradient_from_future(model, idx, probe_positions(model, T))


def cached_logits(model: Transformer, seq: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Logits at positions prompt_len - 1 .. L - 1 of seq, by prefill then one token per step."""
    steps = CachedSteps(model, seq.shape[0], seq.shape[1])
    with torch.no_grad():
        logits = [steps.prefill(seq[:, :prompt_len])]
        for t in range(prompt_len + 1, seq.shape[1] + 1):
            logits.append(steps.step(seq[:, :t]))
    return torch.stack(logits, dim=1)
