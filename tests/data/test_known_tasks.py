"""The known-answer tasks' generators (minitx/data/zoology.py, markov.py, induction.py): the format
each paper describes, the scored positions (-100 elsewhere), Zoology's gap distribution and the
window reach it implies, and the exact Bayes losses of the Markov task against brute force."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest
import torch
import yaml
from test_tasks import task_run

from minitx.cli import eval_main, train_main
from minitx.data.config import DataConfig
from minitx.data.induction import InductionConfig, induction_sample
from minitx.data.markov import MarkovConfig, bayes_nats, markov_sample, unigram_nats
from minitx.data.toy import IGNORE_INDEX, ToyTrainBatches, ToyValSet, exact_match, rows_all_right
from minitx.data.zoology import (
    ZoologyConfig,
    gap_probabilities,
    query_distances,
    reach_shares,
    zoology_sample,
)
from minitx.errors import UserError

# ----------------------------------------------------------------------------------------- Zoology


@pytest.mark.parametrize(
    "config",
    [ZoologyConfig(), ZoologyConfig(vocab=64, pairs=4, seq_len=16), ZoologyConfig(pairs=16, seq_len=256)],
)
def test_zoology_sample_is_zoologys_format(config):
    half = config.vocab // 2
    context = 2 * config.pairs
    for index in range(50):
        s = zoology_sample(config, seed=3, index=index)
        ids, targets, mask = np.array(s.ids), np.array(s.targets), np.array(s.loss_mask)
        assert len(ids) == len(targets) == len(mask) == config.seq_len + 1
        # k1 v1 ... kK vK: distinct keys in 1 .. V/2 - 1, distinct values in V/2 .. V - 1.
        keys, values = ids[0:context:2], ids[1:context:2]
        assert keys.tolist() == list(s.keys) and values.tolist() == list(s.values)
        assert len(set(keys)) == len(set(values)) == config.pairs
        assert keys.min() >= 1 and keys.max() < half and values.min() >= half and values.max() < config.vocab
        # Every key asked once, at offset 2 g into the filler; the rest is token 0.
        queries = context + 2 * np.array(s.gaps)
        assert ids[queries].tolist() == keys.tolist()
        rest = np.ones(len(ids), bool)
        rest[:context], rest[queries] = False, False
        assert (ids[rest] == 0).all()
        # Scored: the token after each query, whose target is the value while its input stays 0.
        assert np.flatnonzero(mask).tolist() == sorted((queries + 1).tolist())
        assert targets[queries + 1].tolist() == values.tolist() and (ids[queries + 1] == 0).all()
        assert (targets[~mask] == ids[~mask]).all()
        assert config.tokenizer().encode(s.text) == s.ids  # the text's ids are Zoology's ids


def random_filler_problems(config: ZoologyConfig, samples: int = 400, seed: int = 5) -> list[str]:
    """What is wrong with the random filler of `config`'s samples (empty: nothing), against Zoology's
    rule: every input position that is not a key, value or query holds a token drawn uniformly
    from 0 .. V - 1; the pairs, the queries and what is scored are those of the same sample with
    the filler at 0 (Figure 2's)."""
    problems, drawn = [], []
    plain = dataclasses.replace(config, random_non_queries=False)
    for index in range(samples):
        s, s0 = zoology_sample(config, seed, index), zoology_sample(plain, seed, index)
        if (s.keys, s.values, s.gaps, s.loss_mask) != (s0.keys, s0.values, s0.gaps, s0.loss_mask):
            problems.append(f"sample {index}: the pairs, gaps or scored positions moved")
        ids, ids0 = np.array(s.ids), np.array(s0.ids)
        filler = np.flatnonzero(ids0[:-1] == 0)  # the input's filler; the last token is only a target
        if not (ids[ids0 != 0] == ids0[ids0 != 0]).all():
            problems.append(f"sample {index}: a key, value or query changed")
        _, _, queries = s.recall_positions()
        if [s.targets[q + 1] for q in queries] != list(s.values) or [s.ids[q] for q in queries] != list(
            s.keys
        ):
            problems.append(f"sample {index}: a scored target is not its value")
        drawn.append(ids[filler])
    counts = np.bincount(np.concatenate(drawn), minlength=config.vocab)
    expected = counts.sum() / config.vocab
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # Uniform over V tokens: chi-square with V - 1 degrees of freedom, mean V - 1, sd sqrt(2 (V - 1));
    # eight sd above the mean is never reached by chance and always by filler left at 0.
    if chi2 > config.vocab - 1 + 8 * math.sqrt(2 * (config.vocab - 1)):
        problems.append(
            f"the filler is not uniform over the vocabulary (chi-square {chi2:.0f}, {config.vocab - 1} dof)"
        )
    return problems


RANDOM_FILLER = ZoologyConfig(vocab=64, pairs=4, seq_len=64, random_non_queries=True)


def test_zoology_random_filler_is_zoologys_uniform_draw():
    assert random_filler_problems(RANDOM_FILLER) == []
    x, y = ToyTrainBatches(
        DataConfig(
            source="zoology", task={"zoology": {**dataclasses.asdict(RANDOM_FILLER)}}
        ).synthetic_task(),
        seed=1,
        train_size=100,
        batch_size=8,
    ).batch(0)
    assert (x == 0).float().mean() < 0.1  # Figure 2's filler would be most of the input
    assert int((y != IGNORE_INDEX).sum()) == 8 * 4  # the same four queries scored per row


def test_a_generator_that_leaves_the_filler_at_0_fails_the_random_filler_test(monkeypatch):
    """The planted bug: the config asks for random filler, the generator leaves token 0."""
    from minitx.data import zoology

    monkeypatch.setattr(zoology, "fill_at_random", lambda ids, vocab, rng: None)
    assert any("not uniform" in problem for problem in random_filler_problems(RANDOM_FILLER))


def test_zoology_random_filler_draws_from_the_whole_vocabulary_not_its_first_half(monkeypatch):
    """A second planted bug: filler drawn from the keys' half only is not Zoology's either."""
    from minitx.data import zoology

    def keys_only(ids, vocab, rng):
        filler = ids[:-1] == 0
        ids[:-1][filler] = rng.integers(vocab // 2, size=int(filler.sum()))

    monkeypatch.setattr(zoology, "fill_at_random", keys_only)
    assert random_filler_problems(RANDOM_FILLER) != []


def test_zoology_batches_score_the_queries_only():
    config = ZoologyConfig(vocab=128, pairs=4, seq_len=32)
    x, y = ToyTrainBatches(config, seed=1, train_size=100, batch_size=16).batch(0)
    assert x.shape == y.shape == (16, 32)
    for row in range(16):
        s = zoology_sample(config, 1, row)
        assert x[row].tolist() == s.ids[:-1]
        scored = (y[row] != IGNORE_INDEX).nonzero().flatten()
        queries = 2 * config.pairs + 2 * torch.tensor(s.gaps)
        assert sorted(scored.tolist()) == sorted(queries.tolist())  # predicted at the query key itself
        assert y[row, queries].tolist() == list(s.values)
    vx, vy = ToyValSet(config, seed=1, train_size=100, size=3)[0]
    assert vx.tolist() == zoology_sample(config, 1, 100).ids[:-1]


def test_zoology_gaps_follow_the_power_law():
    """One query: its gap is drawn from p(g) ~ (g + 1)^-0.99 itself; the share at g = 0 and the mean."""
    config = ZoologyConfig(vocab=64, pairs=1, seq_len=40)  # 19 slots
    p = gap_probabilities(config.gap_slots, config.power_a)
    assert p[0] / p[9] == pytest.approx(10**0.99)
    gaps = np.array([zoology_sample(config, 0, i).gaps[0] for i in range(2000)])
    assert gaps.max() < config.gap_slots
    n = len(gaps)
    assert abs((gaps == 0).mean() - p[0]) < 4 * math.sqrt(p[0] * (1 - p[0]) / n)
    mean = (np.arange(config.gap_slots) * p).sum()
    sd = math.sqrt(((np.arange(config.gap_slots) - mean) ** 2 * p).sum())
    assert abs(gaps.mean() - mean) < 4 * sd / math.sqrt(n)


def test_zoology_window_reach_at_128_8():
    """The share of queries whose value lies within a window of w tokens, from the generator's own
    gaps: 0.08 / 0.32 / 0.59 / 0.82 for w = 8 / 16 / 32 / 64 at (L, K) = (128, 8)."""
    config = ZoologyConfig(seq_len=128, pairs=8)
    shares = reach_shares(config, [8, 16, 32, 64, 128], samples=1000)
    published = {8: 0.08, 16: 0.32, 32: 0.59, 64: 0.82, 128: 1.0}
    assert shares == pytest.approx(published, abs=0.02)


@pytest.mark.parametrize(
    "settings, key",
    [
        ({"zoology": {"vocab": 8191}}, "data.task.zoology.vocab"),
        ({"zoology": {"pairs": 0}}, "data.task.zoology.pairs"),
        ({"zoology": {"seq_len": 31, "pairs": 8}}, "data.task.zoology.seq_len"),
        ({"zoology": {"seq_len": 30, "pairs": 8}}, "data.task.zoology.seq_len"),
        ({"zoology": {"power_a": 0.0}}, "data.task.zoology.power_a"),
        ({"zoology": {"random_non_queries": 1}}, "data.task.zoology.random_non_queries"),
        ({"markov": {"states": 1}}, "data.task.markov.states"),
        ({"markov": {"length": 1}}, "data.task.markov.length"),
        ({"markov": {"concentration": 0}}, "data.task.markov.concentration"),
        ({"induction": {"vocab": 2}}, "data.task.induction.vocab"),
        ({"induction": {"length": 2}}, "data.task.induction.length"),
    ],
)
def test_impossible_settings_name_the_key(settings, key):
    source = next(iter(settings))
    with pytest.raises(UserError, match=key):
        DataConfig(source=source, task=settings)


# ------------------------------------------------------------------------------------------ Markov


def test_markov_sample_follows_its_chain():
    config = MarkovConfig(states=3, length=400)
    s = markov_sample(config, 2, 0)
    assert len(s.ids) == 400 and s.loss_mask == [False] + [True] * 399
    assert np.allclose(s.transitions.sum(1), 1)
    assert config.tokenizer().encode(s.text) == s.ids
    # Transition frequencies over many samples of one chain's rows: pool (prev, next) counts
    # weighted against the rows they came from.
    counts, expected = np.zeros((3, 3)), np.zeros((3, 3))
    for i in range(60):
        s = markov_sample(config, 2, i)
        for a, b in zip(s.ids, s.ids[1:]):
            counts[a, b] += 1
            expected[a] += s.transitions[a]
    assert np.abs(counts - expected).max() < 4 * np.sqrt(expected.max())


def _brute_force_predictives(seq: tuple[int, ...], a: float, grid: int = 400):
    """p(x_{t+1} | x_1..x_t) for k = 2 by integrating over the chain on a grid: the transition
    rows (p, 1 - p) and (q, 1 - q) with Beta(a, a) densities (uniform at a = 1), and for the
    unigram strategy an i.i.d. coin r ~ Beta(a, a). Ratios of marginal likelihoods."""
    u = (np.arange(grid) + 0.5) / grid  # midpoints: p(stay at 0 -> 0) = u, etc.
    prior = (u * (1 - u)) ** (a - 1)
    prior = prior / prior.sum()

    def bigram_marginal(xs):
        like_p, like_q = np.ones(grid), np.ones(grid)
        for prev, nxt in zip(xs, xs[1:]):
            if prev == 0:
                like_p = like_p * (u if nxt == 0 else 1 - u)
            else:
                like_q = like_q * (u if nxt == 1 else 1 - u)
        return (like_p * prior).sum() * (like_q * prior).sum()

    def unigram_marginal(xs):
        like = np.ones(grid)
        for x in xs:
            like = like * (u if x == 0 else 1 - u)
        return (like * prior).sum()

    bigram = [bigram_marginal(seq[: t + 1]) / bigram_marginal(seq[:t]) for t in range(1, len(seq))]
    unigram = [unigram_marginal(seq[: t + 1]) / unigram_marginal(seq[:t]) for t in range(1, len(seq))]
    return np.array(bigram), np.array(unigram)


@pytest.mark.parametrize("a", [1.0, 2.0])
def test_markov_bayes_losses_match_brute_force(a):
    config = MarkovConfig(states=2, length=6, concentration=a)
    for seq in itertools.product((0, 1), repeat=6):
        bigram, unigram = _brute_force_predictives(seq, a)
        assert np.exp(-bayes_nats(list(seq), config)) == pytest.approx(bigram, rel=2e-3)
        assert np.exp(-unigram_nats(list(seq), config)) == pytest.approx(unigram, rel=2e-3)


def test_markov_bayes_is_the_best_predictor_in_expectation():
    """Over every sequence of 6 tokens of 2 states, weighted by its exact probability (the
    product of the two rows' Dirichlet-multinomial marginals, the first state uniform), the
    Bayes bigram loss is below the unigram strategy's and the known chain's entropy bounds it
    from below on average."""
    config = MarkovConfig(states=2, length=6)
    total_prob = bayes = unigram = 0.0
    for seq in itertools.product((0, 1), repeat=6):
        prob = 0.5 * np.exp(-bayes_nats(list(seq), config).sum())  # the chain rule of the predictive
        total_prob += prob
        bayes += prob * bayes_nats(list(seq), config).mean()
        unigram += prob * unigram_nats(list(seq), config).mean()
    assert total_prob == pytest.approx(1.0)
    assert bayes < unigram
    assert bayes < math.log(2)


# --------------------------------------------------------------------------------------- induction


def test_induction_sample_asks_for_the_token_after_the_trigger():
    config = InductionConfig(vocab=16, length=64)
    tokenizer = config.tokenizer()
    assert tokenizer.vocab_size == 16
    for index in range(100):
        s = induction_sample(config, 4, index)
        assert len(s.ids) == 65 and s.loss_mask == [False] * 64 + [True]
        assert [i for i, t in enumerate(s.ids) if t == 0] == [s.trigger_at, 63]  # the trigger, twice
        assert s.ids[64] == s.ids[s.trigger_at + 1] != 0
        assert tokenizer.encode(s.text) == s.ids
    longer = config.at_length(256)
    assert len(longer.sample(4, 0).ids) == 257 and longer.vocab == 16


# ----------------------------------------------------------------------------- scored positions only


def test_rows_all_right_matches_exact_match(seed):
    logits = torch.randn(5, 7, 3)
    y = torch.randint(0, 3, (5, 7)).masked_fill(torch.rand(5, 7) < 0.6, IGNORE_INDEX)
    y[0] = IGNORE_INDEX  # a row without targets is skipped
    y[1, 2] = logits[1, 2].argmax()
    target = y != IGNORE_INDEX
    right = logits.argmax(-1)[target] == y[target]
    assert rows_all_right(right, target) == exact_match(logits, y)


# ------------------------------------------------------------------------- train and evaluate, end to end


def test_known_answer_runs_train_and_are_evaluated(tmp_path, capsys):
    """A few steps of each task through train.py (the logits at the scored positions, the
    item accuracy logged), then evaluate.py: Markov's reference losses, induction's accuracy by
    length (a learned-position model's block_size past its trained length), split by distance
    and by position past the trained length."""

    runs = {
        "zoology": ({"vocab": 64, "pairs": 4, "seq_len": 16}, 16, []),
        "markov": ({"states": 3, "length": 20}, 19, []),
        "induction": ({"vocab": 8, "length": 12}, 24, ["--lengths", "12", "24"]),
    }
    for source, (settings, block_size, flags) in runs.items():
        config = task_run(tmp_path, {"source": source, "task": {source: settings}}, block_size)
        if source == "induction":
            config["model"]["positions"] = "learned"
        (tmp_path / f"{source}.yaml").write_text(yaml.safe_dump(config))
        assert train_main(["--config", str(tmp_path / f"{source}.yaml")]) == 0
        logged = (tmp_path / "runs" / source / "logs" / "version_0" / "metrics.csv").read_text()
        # Markov scores every token (no answers to count right); the other two a few positions.
        assert ("val_item_accuracy" in logged.splitlines()[0]) == (source != "markov")
        ckpt = tmp_path / "runs" / source / "checkpoints" / "last.ckpt"
        out_json = tmp_path / f"{source}.json"
        capsys.readouterr()
        assert eval_main(["--ckpt", str(ckpt), "--task-samples", "20", "--json", str(out_json), *flags]) == 0
        out = capsys.readouterr().out
        result = json.loads(out_json.read_text())
        assert result["task"]["name"] == source and "item accuracy" in out
        if source == "zoology":
            assert result["task"]["items"] == 20 * 4
        if source == "markov":
            references = result["task"]["reference_losses"]
            assert references["bayes_bigram"] < references["unigram"]
            assert "bayes_bigram strategy on the same samples" in out
        if source == "induction":
            by_length = result["by_length"]
            assert by_length["12"]["items"] == by_length["24"]["items"] == 20
            assert "item accuracy by input length" in out
            # Past the trained 12 tokens, split by distance (near: at most 10 tokens back) and by
            # position (early: the letter at a position up to 10).
            assert by_length["24"]["near_items"] + by_length["24"]["far_items"] == 20
            assert by_length["24"]["early_items"] + by_length["24"]["late_items"] == 20
            assert "near_items" not in by_length["12"] and "past the trained length" in out


def test_zoology_query_distances_measure_each_query_from_its_own_value():
    """query_distances (the reach script's, the window test's), in the order the scored positions
    come, read off the ids: each scored position holds a key, and the distance is back to the
    value that follows that key among the pairs."""
    config = ZoologyConfig(vocab=64, pairs=4, seq_len=40)
    samples = [zoology_sample(config, 3, i) for i in range(50)]
    expected = []
    for sample in samples:
        ids = np.array(sample.ids)
        for q in np.flatnonzero(sample.loss_mask) - 1:  # the key asked sits one before each scored target
            expected.append(q - (int(np.flatnonzero(ids[: 2 * config.pairs] == ids[q])[0]) + 1))
    assert query_distances(config, samples).tolist() == expected
