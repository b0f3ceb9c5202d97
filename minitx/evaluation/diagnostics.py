"""Diagnostics of a trained model: attention sinks, massive activations, attention entropy, and
the loss by token position, on held-out text.

    from minitx.evaluation.diagnostics import held_out_sequences, run_diagnostics
    tokens = held_out_sequences(text.tokens, n_sequences=100, seq_len=64)   # (N, T) token ids
    figures = run_diagnostics(model, tokens)                                # a JSON-able dict

The papers that compare attention designs explain their results with these figures: a design that
removes the attention sink (Gated Attention, Qiu et al. 2025, arXiv 2505.06708) or the massive
activations that feed it (Sun et al. 2024, arXiv 2402.17762) should show it here. Definitions are
in the docstrings of SinkFigures, EntropyFigures and MassiveStats and in docs/evaluation.md.

Maps: attention weights come from each kind's materialised path (`Attention.softmax_maps`, which
goes through `reference`): fused attention never forms them. Every softmax map counts on its own,
so differential attention gives two per layer (A1 and A2, each over H/2 heads), and its heads are
pooled with the layer's. MTA's map is the one its values read, after its post-softmax convolution
and head mixing: a mixture of softmax rows, near them as trained from the identity, though a weight
may fall below 0 or a row rise above 1, and such a map has no entropy.

A layer with no softmax map (gdn: a linear recurrence, whose materialised map is signed and
unnormalised) gives an empty list: it has no first-token share, alpha_1 or entropy ("-" in the
report, None in the figures), and the model's figures are over its softmax layers (None for a
model with none). Its massive activations and the loss by position are measured as any layer's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import UserError

EPSILON = 0.3  # Gu et al.'s threshold on alpha_1 for a sink head
# Floats per materialised tensor of one batch (a layer's map, the logits): 64 MB in float32 bounds
# the memory of 100 sequences of any length, at any width.
BATCH_FLOATS = 1 << 24

# ------------------------------------------------------------------------------ per-map figures


def key_zero_by_head(A: Tensor, visible: Tensor) -> tuple[Tensor, Tensor]:
    """Of one map A (B, H, T, T): per sequence and head (B, H), the mean attention on key 0 over
    every query (the first-token share) and over the queries that see key 0 (alpha_1)."""
    column = A[..., 0]  # (B, H, T)
    return column.mean(-1), column.sum(-1) / visible[:, 0].sum().clamp(min=1)


def is_distribution(A: Tensor) -> bool:
    """Whether every row of a map is (at most) a probability distribution: no weight below 0, no
    row above 1 (a row below 1 gave the rest to a learned sink)."""
    return not (bool((A < -1e-6).any()) or bool((A.sum(-1) > 1 + 1e-3).any()))


def entropy_sum(A: Tensor, visible: Tensor) -> tuple[float, int]:
    """The sum over sequences, heads and counted rows of each row's normalised entropy
    -sum_j A[i, j] log A[i, j] / log(n_i), and the number of rows counted: those that see
    n_i >= 2 keys (a row of one key has entropy 0 of at most 0: no figure). Only for a map that
    is a probability distribution (is_distribution)."""
    p = A.clamp(min=0)  # rounding below 0
    per_row = -torch.special.xlogy(p, p).sum(-1)  # (B, H, T); 0 log 0 = 0
    seen = visible.sum(-1)  # (T,)
    rows = seen >= 2
    normalised = per_row[..., rows] / torch.log(seen[rows].to(per_row.dtype))
    return float(normalised.sum()), normalised.numel()


# ------------------------------------------------------------------------- the diagnostics


@dataclass(frozen=True)
class Probed:
    """One batch as every diagnostic sees it (probe): its number of sequences, the tokens (B, T)
    and the logits, and per layer its softmax maps ([] for a layer with none), the (T, T) keys its
    queries see and its output, the (B, T, d_model) residual stream."""

    sequences: int
    maps: list[list[Tensor]]
    visible: list[Tensor | None]
    tokens: Tensor | None
    logits: Tensor | None
    hidden: list[Tensor]


class SinkFigures:
    """The attention sink in the layers' softmax maps, gathered batch by batch:

    first_token_share: the weight A[i, 0] on position 0 (Qiu et al. 2025's "F-Attn": 0.467 for
        their baseline, 0.048 gated), averaged over query rows, the layer's heads (all its maps'
        pooled), sequences and layers. 1 when every query attends to key 0 alone.
    sink_rate: Sink_1 (Gu et al., ICLR 2025, arXiv 2410.10781), the share of (layer, head) pairs
        whose alpha_1, the mean attention position 0 gets from the queries that see it (averaged
        over sequences), exceeds epsilon (0.3, theirs).
    Both are over the layers with a softmax map (None for a model with none)."""

    reported = {"first_token_share": "first-token share", "sink_rate": "sink rate"}

    def __init__(self, epsilon: float = EPSILON):
        self.epsilon = epsilon
        self.sequences = 0
        # Per layer: the first-token share summed over sequences (a mean over heads), and alpha_1
        # per head summed over sequences; a layer with no softmax map has neither.
        self.share: dict[int, float] = {}
        self.alpha: dict[int, Tensor] = {}

    def add(self, batch: Probed) -> None:
        self.sequences += batch.sequences
        for layer, (own, v) in enumerate(zip(batch.maps, batch.visible)):
            if not own:  # no softmax map (gdn)
                continue
            firsts, alphas = zip(*(key_zero_by_head(m.float(), v) for m in own))
            self.share[layer] = self.share.get(layer, 0.0) + float(torch.cat(firsts, dim=1).mean(1).sum())
            heads = torch.cat(alphas, dim=1).sum(0)
            self.alpha[layer] = self.alpha[layer] + heads if layer in self.alpha else heads

    def result(self) -> dict:
        if not self.alpha:
            return {"first_token_share": None, "sink_rate": None}
        heads = torch.cat(list(self.alpha.values())) / self.sequences
        return {
            "first_token_share": sum(self.share.values()) / (self.sequences * len(self.share)),
            "sink_rate": float((heads > self.epsilon).float().mean()),
        }


class EntropyFigures:
    """entropy: the normalised attention entropy (Zhai et al., ICML 2023, arXiv 2303.06296) of each
    query row, -sum_j A[i, j] log A[i, j] / log(n_i) over the n_i keys it sees (entropy_sum); the
    mean over every counted row of every map, head, sequence and layer, and per layer
    (entropy_by_layer), with why a layer has none (entropy_missing). With learned sinks a row sums
    to less than 1: the real keys' weights are taken as they are, so mass on the sink lowers the
    entropy as attention to nothing should."""

    reported = {"entropy": "attention entropy (normalised)"}

    def __init__(self) -> None:
        # Per layer: the entropy summed over counted rows, their number, and why a layer with no
        # counted row has no figure: no softmax map, a map that is no probability distribution (a
        # weight below 0 or a row above 1: MTA's after its mixing), or rows of one key each.
        self.sums: list[list] = []

    def add(self, batch: Probed) -> None:
        self.sums = self.sums or [[0.0, 0, "one key" if own else "no softmax map"] for own in batch.maps]
        for own, v, sums in zip(batch.maps, batch.visible, self.sums):
            for m in own:
                if not is_distribution(m.float()):
                    sums[2] = "not a distribution"
                    continue
                s, n = entropy_sum(m.float(), v)
                sums[0] += s
                sums[1] += n

    def result(self) -> dict:
        counted = sum(n for _, n, _ in self.sums)
        return {
            "entropy": sum(s for s, _, _ in self.sums) / counted if counted else None,
            "entropy_by_layer": [s / n if n else None for s, n, _ in self.sums],
            "entropy_missing": [None if n else why for _, n, why in self.sums],
        }


def position_losses(logits: Tensor, tokens: Tensor) -> Tensor:
    """(T - 1,) summed over sequences: the loss at query position t of predicting token t + 1."""
    losses = F.cross_entropy(
        logits[:, :-1].float().flatten(0, 1), tokens[:, 1:].flatten(), reduction="none"
    ).view(tokens.shape[0], -1)
    return losses.sum(0)


@torch.inference_mode()
def loss_by_position(model, tokens: Tensor) -> list[float]:
    """The loss (nats) of predicting token t + 1 from tokens 0..t, for t = 0 .. T - 2 of tokens
    (N, T), averaged over the N sequences: T - 1 figures, one per query position."""
    tokens = tokens.to(next(model.parameters()).device)
    return (position_losses(model(tokens), tokens) / tokens.shape[0]).tolist()


class MassiveStats:
    """A layer's massive activations (Sun et al. 2024, arXiv 2402.17762), gathered batch by batch
    from its output, the (B, T, d_model) residual stream: {"ratio": max |h| / median |h|, "max":
    max |h|, "position", "channel": where the largest sits (its token position and feature)}. The
    median is each sequence's median |h| over positions and channels, averaged over sequences, so
    that the figure does not depend on how sequences are batched. Sun et al. call an activation
    massive past |h| > 100 and about 1000x the median; at small scale the ratio itself is the figure."""

    def __init__(self) -> None:
        self.max, self.position, self.channel = -1.0, 0, 0
        self.median_sum, self.sequences = 0.0, 0

    def add(self, h: Tensor) -> None:
        a = h.detach().float().abs()
        B, T, d = a.shape
        index = int(a.argmax())
        if float(a.flatten()[index]) > self.max:
            self.max = float(a.flatten()[index])
            self.position, self.channel = (index // d) % T, index % d
        self.median_sum += float(a.view(B, -1).median(dim=1).values.sum())
        self.sequences += B

    def result(self) -> dict:
        median = self.median_sum / self.sequences
        ratio = self.max / median if median > 0 else math.inf
        return {"ratio": ratio, "position": self.position, "channel": self.channel, "max": self.max}


class MassiveFigures:
    """massive_ratio: the largest of the layers' ratios; massive: each layer's MassiveStats."""

    reported = {"massive_ratio": "massive act. (max/median)"}

    def __init__(self) -> None:
        self.layers: list[MassiveStats] = []

    def add(self, batch: Probed) -> None:
        self.layers = self.layers or [MassiveStats() for _ in batch.hidden]
        for stats, h in zip(self.layers, batch.hidden):
            stats.add(h)

    def result(self) -> dict:
        per_layer = [stats.result() for stats in self.layers]
        return {"massive_ratio": max(entry["ratio"] for entry in per_layer), "massive": per_layer}


class PositionLosses:
    """loss_by_position: see loss_by_position. No sweep reports it."""

    reported: dict[str, str] = {}

    def __init__(self) -> None:
        self.summed: Tensor | float = 0.0
        self.sequences = 0

    def add(self, batch: Probed) -> None:
        self.summed = self.summed + position_losses(batch.logits, batch.tokens)
        self.sequences += batch.sequences

    def result(self) -> dict:
        return {"loss_by_position": (self.summed / self.sequences).tolist()}


# Every diagnostic, in the order of run_diagnostics's figures and of a sweep's columns. A diagnostic
# is a class, built with no arguments for each run: add(batch) takes each batch (a Probed),
# result() gives its figures (JSON-able; None where a model has none), `reported` names those a
# sweep reports (results.csv's columns, its tables and plots) with their names there. A new one is
# a file of its own (minitx/evaluation/<name>.py) and its entry here.
FIGURES = (
    SinkFigures,
    MassiveFigures,
    EntropyFigures,
    PositionLosses,
)
# The per-run figures a sweep reports, each with its name in the sweep's tables and plots.
DIAGNOSTICS = {key: name for figures in FIGURES for key, name in figures.reported.items()}


# ------------------------------------------------------------------------------- on a model


@torch.inference_mode()
def probe(model, tokens: Tensor, visible: list[Tensor]) -> Probed:
    """The logits, each layer's softmax maps and each layer's output of one batch of tokens (B, T),
    whose layers' queries see `visible`.

    The layers run as the model's forward runs them (documents included: a document token restarts
    learned positions and hides other documents' keys); each layer's maps come from its
    materialised path on the same input, over the whole sequence as one text."""
    T = tokens.shape[1]
    docs = model.documents(tokens)
    x = model.embed(tokens, 0, docs)
    rope = model.rope(0, T) if model.rope is not None else None
    maps, hidden = [], []
    for block in model.blocks:
        maps.append(block.attn.softmax_maps(block.norm1(x), rope))
        x = block(x, rope, None, docs)
        hidden.append(x)
    return Probed(tokens.shape[0], maps, visible, tokens, model.lm_head(model.norm(x)), hidden)


def check_tokens(model, tokens) -> None:
    if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.dtype.is_floating_point:
        raise UserError("diagnostics: tokens must be an (N, T) tensor of token ids; see held_out_sequences")
    N, T = tokens.shape
    block = model.config.block_size
    if N < 1 or not 2 <= T <= block:
        raise UserError(
            f"diagnostics: tokens are {N} sequences of {T}; use 1 or more sequences of 2 .. block_size={block} tokens"
        )


def batch_size(model, T: int) -> int:
    """Sequences per forward pass: each layer's maps and the logits within BATCH_FLOATS."""
    config = model.config
    per_sequence = max(2 * config.n_head * T * T, T * config.vocab_size, T * config.mlp_hidden)
    return max(1, BATCH_FLOATS // per_sequence)


def run_diagnostics(model, tokens: Tensor) -> dict:
    """Every diagnostic of `model` (FIGURES) on tokens (N, T) of held-out text, as a JSON-able dict:

        first_token_share   float, see SinkFigures (None: no layer has a softmax map)
        sink_rate           float in [0, 1], see SinkFigures (epsilon 0.3; None as above)
        massive_ratio       float, the largest per-layer ratio of `massive`
        massive             per layer {"ratio", "position", "channel", "max"}, see MassiveStats
        entropy             float, mean normalised entropy over all maps, layers, heads, rows
        entropy_by_layer    per layer (None for a layer whose rows all see one key, or with no
                            softmax map, or whose map is no distribution)
        entropy_missing     per layer, why its entropy is None: "no softmax map" (gdn), "not a
                            distribution" (MTA's map after its post-softmax convolution and head
                            mixing: a weight below 0 or a row above 1), "one key"; None where it has one
        loss_by_position    T - 1 floats, see loss_by_position
        n_sequences, seq_len

    Runs in inference mode with the model in eval mode (its mode is restored), in batches that
    keep each materialised map within BATCH_FLOATS floats."""
    check_tokens(model, tokens)
    N, T = tokens.shape
    device = next(model.parameters()).device
    tokens = tokens.to(device)
    visible = [block.attn.visible_keys(T, device) for block in model.blocks]
    diagnostics = [figures() for figures in FIGURES]
    was_training = model.training
    model.eval()
    try:
        step = batch_size(model, T)
        for start in range(0, N, step):
            batch = probe(model, tokens[start : start + step], visible)
            for diagnostic in diagnostics:
                diagnostic.add(batch)
    finally:
        model.train(was_training)
    found = {key: value for diagnostic in diagnostics for key, value in diagnostic.result().items()}
    return {**found, "n_sequences": N, "seq_len": T}


def held_out_sequences(
    tokens: Tensor | Sequence[int], n_sequences: int = 100, seq_len: int = 64, flag: str = "--diagnostics"
) -> Tensor:
    """(n, seq_len) int64 token ids cut from a held-out text's tokens (1-D: a tensor, or the
    validation shards of minitx.evaluation.texts.validation_text(...).tokens): non-overlapping
    windows spread evenly over the whole text, n = n_sequences where the text has room, else as
    many as it holds. A text shorter than one window is a UserError naming `flag`."""
    if n_sequences < 1 or seq_len < 2:
        raise UserError(
            f"{flag}: {n_sequences} sequences of {seq_len} tokens; use 1 or more sequences of 2 or more"
        )
    length = len(tokens)
    n = min(n_sequences, length // seq_len)
    if n < 1:
        raise UserError(
            f"{flag}: the text has {length} tokens, fewer than one sequence of {seq_len}; give a longer text (--files)"
        )
    # Starts i * (L - T) // (n - 1) lie at least T apart whenever L >= n T: no window overlaps another.
    starts = [0] if n == 1 else [i * (length - seq_len) // (n - 1) for i in range(n)]
    rows = [torch.as_tensor(tokens[s : s + seq_len], dtype=torch.int64) for s in starts]
    return torch.stack(rows)


def validation_sequences(
    train_config: dict | None, tokenizer, n_sequences: int = 100, seq_len: int = 64
) -> Tensor:
    """held_out_sequences of a run's own validation text, rebuilt from the data settings its
    checkpoint carries: load_checkpoint(path) gives (model, tokenizer, raw), and the settings are
    raw["minitx"]["train_config"]. Keep seq_len within the model's block_size."""
    from .texts import validation_text  # the data pipeline: imported only when a text is read

    return held_out_sequences(validation_text(train_config, tokenizer).tokens, n_sequences, seq_len)
