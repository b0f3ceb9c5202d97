"""In-context Markov chains (Edelman et al. 2024, "The evolution of statistical induction heads").

Every sample is a fresh Markov chain over `states` symbols: each row of its transition matrix is
drawn from a symmetric Dirichlet(`concentration`) prior, the first state uniformly, then `length`
- 1 transitions. Every next token is scored. No two samples share a chain, so a model can only
learn to estimate the chain from its own context: the best it can do is the Bayes posterior
predictive, which for this prior is a count ratio (a Dirichlet is conjugate to the transitions):

    p(x_{t+1} = j | x_1..x_t) = (n_{x_t -> j} + a) / (n_{x_t ->} + k a)        (bigram: Bayes-optimal)

where n_{i -> j} counts the transitions i -> j among x_1..x_t, k = states, a = concentration.
A model that ignores which state came last and only counts tokens plays the unigram strategy,
the posterior predictive of an i.i.d. draw under the same Dirichlet prior:

    q(x_{t+1} = j | x_1..x_t) = (n_j + a) / (t + k a)

`bayes_nats` and `unigram_nats` give both losses, per position, exactly (no estimate: the counts
are the sample's). Edelman et al. find that a 2-layer attention model approaches the bigram loss
through an induction head, after a plateau at the unigram strategy; one layer cannot form an
induction head and stays near the unigram loss.

The first state is uniform, not the chain's stationary distribution, so that it says nothing
about the transitions and the count ratio above is exactly the posterior predictive.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np

from minitx.data.task import Task, TaskSpec
from minitx.data.tokenizer import CharTokenizer
from minitx.errors import require

SYMBOLS = string.ascii_lowercase  # state i is the letter SYMBOLS[i]; its token id is i


@dataclass(frozen=True)
class MarkovConfig(Task):
    """data.task.markov: the in-context Markov chain task's settings (data.source=markov)."""

    states: int = 3  # k: symbols of the chain
    length: int = 100  # tokens per sample (length - 1 of them scored)
    concentration: float = 1.0  # a: each transition row ~ Dirichlet(a, ..., a); 1 is uniform on the simplex

    def __post_init__(self) -> None:
        require(
            2 <= self.states <= len(SYMBOLS),
            f"data.task.markov.states: must be 2..{len(SYMBOLS)}, got {self.states}",
        )
        require(self.length >= 2, f"data.task.markov.length: must be at least 2 tokens, got {self.length}")
        require(
            self.concentration > 0,
            f"data.task.markov.concentration: must be positive (the Dirichlet prior's), got {self.concentration}",
        )

    # The task interface (minitx/data/task.py).
    def sample(self, seed: int, index: int) -> MarkovSample:
        return markov_sample(self, seed, index)

    def max_length(self) -> int:
        return self.length

    def tokenizer(self) -> CharTokenizer:
        return CharTokenizer(SYMBOLS[: self.states])

    def reference_losses(self, samples: list[MarkovSample]) -> dict[str, float]:
        """The two strategies' mean loss per scored token on these samples (evaluation prints them
        beside the model's)."""
        return {
            "bayes_bigram": float(np.mean([bayes_nats(s.ids, self) for s in samples])),
            "unigram": float(np.mean([unigram_nats(s.ids, self) for s in samples])),
        }


MARKOV = TaskSpec("markov", MarkovConfig, length_option="length")


@dataclass(frozen=True)
class MarkovSample:
    transitions: np.ndarray  # (states, states): row i is p(next | i)
    ids: list[int]
    loss_mask: list[bool]  # every token but the first

    @property
    def text(self) -> str:
        return "".join(SYMBOLS[i] for i in self.ids)


def markov_sample(config: MarkovConfig, seed: int, index: int) -> MarkovSample:
    """Sample `index` of the stream `seed`: a pure function of its arguments."""
    rng = np.random.default_rng([seed, index])
    k = config.states
    transitions = rng.dirichlet(np.full(k, config.concentration), size=k)
    # Inverse-CDF draws, all uniforms at once: state t+1 is the first j with cumsum_j > u_t.
    cumulative = np.cumsum(transitions, axis=1)
    uniforms = rng.random(config.length)
    ids = np.empty(config.length, dtype=np.int64)
    ids[0] = min(int(uniforms[0] * k), k - 1)
    for t in range(1, config.length):
        ids[t] = min(int(np.searchsorted(cumulative[ids[t - 1]], uniforms[t], side="right")), k - 1)
    return MarkovSample(transitions, ids.tolist(), [False] + [True] * (config.length - 1))


def bayes_nats(ids: list[int], config: MarkovConfig) -> np.ndarray:
    """-log p(x_{t+1} | x_1..x_t) under the Bayes bigram predictive, for t = 1..length-1."""
    k, a = config.states, config.concentration
    pair_counts = np.zeros((k, k))
    nats = np.empty(len(ids) - 1)
    for t in range(1, len(ids)):
        prev, token = ids[t - 1], ids[t]
        nats[t - 1] = -np.log((pair_counts[prev, token] + a) / (pair_counts[prev].sum() + k * a))
        pair_counts[prev, token] += 1
    return nats


def unigram_nats(ids: list[int], config: MarkovConfig) -> np.ndarray:
    """-log q(x_{t+1} | x_1..x_t) under the unigram strategy (token counts only), t = 1..length-1."""
    k, a = config.states, config.concentration
    counts = np.zeros(k)
    counts[ids[0]] += 1
    nats = np.empty(len(ids) - 1)
    for t in range(1, len(ids)):
        nats[t - 1] = -np.log((counts[ids[t]] + a) / (t + k * a))
        counts[ids[t]] += 1
    return nats
