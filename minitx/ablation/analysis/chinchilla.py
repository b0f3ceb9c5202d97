"""Chinchilla's L(N, D) = E + A (N/N0)^-a + B (D/D0)^-b: the ladder's second view, per arm."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product

import numpy as np

from ...errors import UserError
from .curves import ALPHA_MAX, FLAT
from .solver import huber, huber_fit


@dataclass(frozen=True)
class NDFit:
    """L(N, D) = E + A (N/N0)^-a + B (D/D0)^-b (Chinchilla's third approach)."""

    E: float
    A: float
    a: float
    B: float
    b: float
    N0: float
    D0: float

    def loss(self, N, D):
        return (
            self.E
            + self.A * (np.asarray(N) / self.N0) ** (-self.a)
            + self.B * (np.asarray(D) / self.D0) ** (-self.b)
        )

    def tokens_for(self, N: float, loss: float) -> float:
        """The tokens at which a model of N parameters reaches `loss` (inf: never; nan: flat in D)."""
        if self.b <= FLAT or self.B <= 0:
            return math.nan
        reducible = loss - self.E - self.A * (N / self.N0) ** (-self.a)
        if reducible <= 0:
            return math.inf
        return self.D0 * (reducible / self.B) ** (-1.0 / self.b)


def fit_nd(
    params: Sequence[float],
    tokens: Sequence[float],
    loss: Sequence[float],
    N0: float | None = None,
    D0: float | None = None,
) -> NDFit:
    """The Huber fit in log space of L(N, D), written as log L = LSE(e, log A - a log n,
    log B - b log d) (n, d: N and D over their geometric means) so every term stays positive,
    from a grid of 3^4 starts in (e, a, b, the split of the reducible loss). N0, D0: the
    reference sizes (default: the points' geometric means). Needs points at
    3 or more sizes and 3 or more token counts: five parameters need both axes to vary."""
    N, D, y = (np.asarray(v, dtype=float) for v in (params, tokens, loss))
    if len(set(N.tolist())) < 3 or len(set(D.tolist())) < 3 or len(y) < 7:
        raise UserError("L(N, D) needs 3 or more sizes and 3 or more token counts (7 or more points)")
    N0 = N0 or float(np.exp(np.mean(np.log(N))))  # given: A and B comparable across arms
    D0 = D0 or float(np.exp(np.mean(np.log(D))))
    log_n, log_d, log_y = np.log(N / N0), np.log(D / D0), np.log(y)
    low = float(y.min())

    def residuals(theta: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        e, la, a, lb, b = (theta[:, i : i + 1] for i in range(5))
        terms = np.stack([np.broadcast_to(e, (len(theta), len(y))), la - a * log_n, lb - b * log_d])
        top = terms.max(axis=0)
        weights = np.exp(terms - top)
        share = weights / weights.sum(axis=0)  # d log L / d each term
        J = np.stack([share[0], share[1], -share[1] * log_n, share[2], -share[2] * log_d], axis=-1)
        return top + np.log(weights.sum(axis=0)) - log_y, J  # log L, the LSE, minus log y

    starts = []
    for e_share, a, b, split in product((0.3, 0.6, 0.9), (0.1, 0.4, 1.0), (0.1, 0.4, 1.0), (0.25, 0.5, 0.75)):
        rest = max(float(np.mean(y)) - e_share * low, 1e-3)
        starts.append([math.log(e_share * low), math.log(split * rest), a, math.log((1 - split) * rest), b])
    starts = np.array(starts)
    bounds = np.empty((len(starts), 5, 2))
    bounds[:] = [(-10.0, math.log(low)), (-12.0, 6.0), (0.0, ALPHA_MAX), (-12.0, 6.0), (0.0, ALPHA_MAX)]
    theta = huber_fit(residuals, starts, bounds)
    e, la, a, lb, b = theta[int(np.argmin(huber(residuals(theta, np.arange(len(theta)))[0]).sum(axis=1)))]
    return NDFit(math.exp(e), math.exp(la), float(a), math.exp(lb), float(b), N0, D0)
