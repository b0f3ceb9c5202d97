"""BatchedMuon's step against Muon's update written out one matrix at a time.

BatchedMuon stacks same-shaped matrices, writes the Nesterov update into the stack, scales and
iterates in place in preallocated buffers and applies the updates with torch._foreach_*: all of
that must leave each matrix's numbers those of the plain loop below (torch.optim.Muon's maths, in
float32), matrix by matrix, step by step, for every setting that changes the arithmetic.
"""

from __future__ import annotations

import pytest
import torch

from minitx.training.optim import BatchedMuon, muon_lr_scale, orthogonalise

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


def plain_newton_schulz(x: torch.Tensor, coefficients, steps: int) -> torch.Tensor:
    a, b, c = coefficients
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x


@pytest.mark.parametrize("steps", [1, 2, 4, 5, 7])
@pytest.mark.parametrize("shape", [(3, 16, 64), (2, 48, 16), (2, 1, 9), (2, 12, 19)])
def test_gram_side_iteration_errs_as_the_plain_form(shape, steps, one_thread):
    """Wide matrices iterate on their Gram matrix (orthogonalise picks it): against a float64 run
    of the plain iteration it must err no more than the plain iteration run in float32, also on
    updates whose singular values span nine orders of magnitude (gradients are near low rank),
    where carrying the Gram matrix over too many steps loses digits."""
    torch.manual_seed(steps)
    n, rows, columns = shape
    wide = min(rows, columns)
    u, _ = torch.linalg.qr(torch.randn(n, max(rows, columns), wide, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(n, wide, wide, dtype=torch.float64))
    singular = torch.logspace(0, -9, wide, dtype=torch.float64) * torch.rand(wide, dtype=torch.float64)
    update = (u * singular) @ v.mT
    if rows < columns:
        update = update.mT
    coefficients, eps = (3.4445, -4.7750, 2.0315), 1e-7
    ortho = orthogonalise(update.float().clone(), coefficients, steps, eps)

    x = update.mT if rows > columns else update
    x = x / x.norm(dim=(-2, -1), keepdim=True)
    reference = plain_newton_schulz(x, coefficients, steps)
    plain32 = plain_newton_schulz(x.float(), coefficients, steps).double()
    if rows > columns:
        reference, plain32 = reference.mT, plain32.mT
    error = (ortho.double() - reference).abs().max()
    plain_error = (plain32 - reference).abs().max()
    assert ortho.shape == update.shape
    assert error <= 3 * plain_error + 1e-7, (error, plain_error)
