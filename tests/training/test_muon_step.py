"""BatchedMuon's step against Muon's update written out one matrix at a time.

BatchedMuon stacks same-shaped matrices, writes the Nesterov update into the stack, scales and
iterates in place in preallocated buffers and applies the updates with torch._foreach_*: all of
that must leave each matrix's numbers those of the plain loop below (torch.optim.Muon's maths, in
float32), matrix by matrix, step by step, for every setting that changes the arithmetic.
"""

from __future__ import annotations

import pytest
import torch

from minitx.training.optim import BatchedMuon, muon_lr_scale

# Awkward shapes: repeated ones (stacked together), tall and wide (transposed for the
# iteration), square, one row, and one that appears once.
SHAPES = [(24, 8), (8, 8), (8, 24), (24, 8), (8, 8), (1, 5), (7, 3), (8, 24), (3, 7)]


def plain_muon_step(params, buffers, group: dict) -> None:
    """One Muon step, matrix by matrix: momentum, Nesterov, Newton-Schulz on the wide side in
    float32, decoupled weight decay, the update scaled by the shape's lr multiplier."""
    a, b, c = group["ns_coefficients"]
    lr, momentum, decay = group["lr"], group["momentum"], group["weight_decay"]
    for param, buffer in zip(params, buffers):
        if param.grad is None:
            continue
        buffer.lerp_(param.grad, 1 - momentum)
        update = param.grad.lerp(buffer, momentum) if group["nesterov"] else buffer.clone()
        x = update[None].float()  # a batch of one, as the products are batched in BatchedMuon
        tall = x.size(-2) > x.size(-1)
        if tall:
            x = x.mT
        x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=group["eps"])
        for _ in range(group["ns_steps"]):
            gram = x @ x.mT
            poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
            x = torch.baddbmm(x, poly, x, beta=a)
        ortho = (x.mT if tall else x)[0]
        param.mul_(1 - lr * decay)
        param.add_(ortho, alpha=-lr * muon_lr_scale(param.shape, group["adjust_lr_fn"]))


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"weight_decay": 0.1},
        {"nesterov": False, "weight_decay": 0.05},
        {"adjust_lr_fn": "match_rms_adamw"},
    ],
    ids=["default", "decay", "no-nesterov", "match-rms"],
)
def test_batched_muon_is_the_plain_step(settings, one_thread):
    torch.manual_seed(0)
    start = [torch.randn(shape) * 0.1 for shape in SHAPES]
    params = [torch.nn.Parameter(w.clone()) for w in start]
    plain = [w.clone() for w in start]
    buffers = [torch.zeros_like(w) for w in start]
    optimizer = BatchedMuon(params, lr=0.02, momentum=0.95, **settings)
    group = optimizer.param_groups[0]
    for step in range(3):
        grads = [torch.randn(shape) for shape in SHAPES]
        if step == 1:
            grads[2] = None  # a matrix without a gradient is left alone, buffer included
        for param, reference, grad in zip(params, plain, grads):
            param.grad = None if grad is None else grad.clone()
            reference.grad = None if grad is None else grad.clone()
        optimizer.step()
        with torch.no_grad():
            plain_muon_step(plain, buffers, group)
        for n, (param, reference) in enumerate(zip(params, plain)):
            torch.testing.assert_close(param.detach(), reference, rtol=1e-6, atol=1e-7, msg=f"matrix {n}")
            buffer = optimizer.state[param]["momentum_buffer"]
            torch.testing.assert_close(buffer, buffers[n], rtol=1e-6, atol=1e-7, msg=f"buffer {n}")
