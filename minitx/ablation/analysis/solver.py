"""A batched robust least-squares solver: many small Huber fits at once (the ladder's point fit,
its bootstrap's refits and its leave-one-size-out refits are each one call)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import numpy as np

HUBER_DELTA = 1e-3


@contextmanager
def one_blas_thread():
    """BLAS on one thread while fitting: L-BFGS-B calls it on small vectors, and OpenBLAS's
    threads then spin and wait, worst beside training runs (a fit took 10-60x longer, measured)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def huber(r: np.ndarray, delta: float = HUBER_DELTA) -> np.ndarray:
    a = np.abs(r)
    return np.where(a <= delta, 0.5 * r**2, delta * (a - 0.5 * delta))


def huber_fit(
    residuals: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    starts: np.ndarray,
    bounds: np.ndarray,
    delta: float = HUBER_DELTA,
    iterations: int = 400,
) -> np.ndarray:
    """Many independent small Huber fits at once. `residuals` maps parameters (S, P) to the
    log-space residuals (S, n) and their Jacobian (S, n, P); each row minimises
    sum Huber(r) within `bounds` (S, P, 2) from its start. Iteratively reweighted Gauss-Newton:
    the Huber loss is sum w r^2 / 2 with w = min(1, delta / |r|) held at the current r, a damped
    (Levenberg-Marquardt) step solves that least squares, a row keeps a step only if its Huber
    loss fell (else its damping grows), and a step is clipped into the bounds. A fixed point has
    J^T (w r) = J^T psi(r) = 0: the Huber fit's own condition. A bootstrap's 200 refits cost as
    many numpy calls as one; tests/ablation/test_ladder.py checks it against scipy's L-BFGS-B."""
    theta = np.clip(starts.astype(float), bounds[..., 0], bounds[..., 1])
    rows, P = theta.shape
    r, J = residuals(theta, np.arange(rows))
    loss = huber(r, delta).sum(axis=1)
    damping = np.full(rows, 1e-3)
    active = np.arange(rows)  # the rows still moving: a converged row costs nothing more
    eye = np.eye(P)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"), one_blas_thread():
        for _ in range(iterations):
            if active.size == 0:
                break
            ra, Ja, now = r[active], J[active], theta[active]
            w = np.minimum(1.0, delta / np.maximum(np.abs(ra), 1e-300))
            JtW = np.swapaxes(Ja, 1, 2) * w[:, None, :]
            H = JtW @ Ja
            g = (JtW @ ra[..., None])[..., 0]
            scale = np.maximum(np.diagonal(H, axis1=1, axis2=2), 1e-12)
            system = H + damping[active, None, None] * (scale[:, :, None] * eye) + 1e-15 * eye
            step = -np.linalg.solve(system, g[..., None])[..., 0]
            trial = np.clip(now + np.nan_to_num(step), bounds[active, :, 0], bounds[active, :, 1])
            r_new, J_new = residuals(trial, active)
            loss_new = huber(r_new, delta).sum(axis=1)
            better = loss_new < loss[active]
            keep = active[better]
            theta[keep], loss[keep] = trial[better], loss_new[better]
            r[keep], J[keep] = r_new[better], J_new[better]
            damping[active] = np.where(better, np.maximum(damping[active] / 3, 1e-9), damping[active] * 4)
            # done: the step moved no parameter by more than 1e-7, or no step can lower the loss
            small = np.max(np.abs(trial - now), axis=1) < 1e-7
            active = active[~(small | (damping[active] > 1e8))]
    return theta
