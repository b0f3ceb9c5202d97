"""The recall circuit's two weights (minitx/evaluation/recall_circuit.py) read off hand-built
attention maps whose answer is known, on Zoology's MQAR and on the induction-heads task; the
positions each task's samples give; evaluate.py's figure and scripts/zoology_reach.py on real
models."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minitx.config import ModelConfig
from minitx.data.induction import InductionConfig, induction_sample
from minitx.data.toy import toy_batch
from minitx.data.zoology import ZoologyConfig, zoology_sample
from minitx.evaluation.recall_circuit import RecallCircuit, recall_circuit
from minitx.evaluation.tasks import task_recall_circuit
from minitx.model import Transformer

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ZoologyConfig(vocab=64, pairs=4, seq_len=32)


def _samples(count: int):
    return [zoology_sample(CONFIG, 7, i) for i in range(count)]


def _uniform(batch: int, heads: int, length: int) -> torch.Tensor:
    causal = torch.ones(length, length).tril()
    return (causal / causal.sum(-1, keepdim=True)).expand(batch, heads, length, length).clone()


def _circuit_maps(samples, heads: int = 2, key_offset: int = 1, value_offset: int = 0):
    """Uniform causal maps, except: in the first layer each value (2i + 1) looks at the token
    `key_offset` before it, and in the last each query looks at its value's position plus
    `value_offset`; `key_offset` 1 and `value_offset` 0 are the circuit."""
    length = CONFIG.seq_len
    first, last = _uniform(len(samples), heads, length), _uniform(len(samples), heads, length)
    for row, sample in enumerate(samples):
        for i in range(CONFIG.pairs):
            value = 2 * i + 1
            first[row, :, value] = 0.0
            first[row, :, value, value - key_offset] = 1.0
        for query, scored in enumerate(sample.loss_mask[1:]):
            if scored:
                asked = sample.keys.index(sample.ids[query])
                last[row, :, query] = 0.0
                last[row, :, query, 2 * asked + 1 + value_offset] = 1.0
    return [first, last]


def test_the_circuit_reads_one_where_the_maps_hold_it():
    samples = _samples(6)
    circuit = recall_circuit(_circuit_maps(samples), samples)
    assert circuit.previous_key == pytest.approx(1.0)
    assert circuit.value_read == pytest.approx(1.0)


def test_maps_one_position_off_read_zero():
    samples = _samples(6)
    # each value looking at itself, each query at the token after its value (the next key)
    circuit = recall_circuit(_circuit_maps(samples, key_offset=0, value_offset=1), samples)
    assert circuit.previous_key == pytest.approx(0.0)
    assert circuit.value_read == pytest.approx(0.0)


def test_heads_are_averaged_and_middle_layers_ignored():
    samples = _samples(3)
    first, last = _circuit_maps(samples, heads=2)
    uniform = _uniform(len(samples), 2, CONFIG.seq_len)
    first[:, 1], last[:, 1] = uniform[:, 1], uniform[:, 1]  # the second head of each looks everywhere
    circuit = recall_circuit([first, torch.zeros_like(first), last], samples)
    # a value at 2i + 1 sees 2i + 2 tokens: the uniform head gives its key 1 / (2i + 2)
    uniform_first = sum(1 / (2 * i + 2) for i in range(CONFIG.pairs)) / CONFIG.pairs
    assert circuit.previous_key == pytest.approx((1 + uniform_first) / 2)
    queries = [q for s in samples for q, scored in enumerate(s.loss_mask[1:]) if scored]
    uniform_last = sum(1 / (q + 1) for q in queries) / len(queries)
    assert circuit.value_read == pytest.approx((1 + uniform_last) / 2)


@pytest.mark.slow  # trains a checkpoint and runs the script on it: about 4 s
def test_the_script_reports_the_circuit_and_the_reach_of_a_checkpoint(tmp_path):
    config = ModelConfig(
        vocab_size=CONFIG.vocab, block_size=CONFIG.seq_len, n_layer=2, n_head=1, d_model=16, mlp="none"
    )
    model = Transformer(config).eval()
    path = tmp_path / "tiny.ckpt"
    tokenizer = {"kind": "char", "chars": [chr(0x4E00 + t) for t in range(CONFIG.vocab)]}
    minitx = {"format": 1, "model_config": config.to_dict(), "tokenizer": tokenizer}
    torch.save(
        {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}, "minitx": minitx}, path
    )
    args = ["--ckpt", str(path), "--vocab", "64", "--pairs", "4", "--seq-len", "32", "--samples", "20"]
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts/zoology_reach.py"),
            *args,
            "--circuit-samples",
            "8",
            "--window",
            "5",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    ).stdout
    samples = [zoology_sample(CONFIG, 12345, i) for i in range(8)]
    x, _ = toy_batch(samples, None, CONFIG.pad_id)
    expected = recall_circuit(model.attention_maps(x), samples)
    assert f"first layer, each value's weight on its key: {expected.previous_key:.3f}" in out
    assert f"each query's weight on its value: {expected.value_read:.3f} (8 samples)" in out
    # the window's three distance bands hold every query of the 20 samples once
    counts = re.findall(r"over (\d+) queries", out)
    assert len(counts) == 3 and sum(map(int, counts)) == 20 * CONFIG.pairs
    # a window as long as the sequence leaves no query out of reach: said so, without a warning
    wide = subprocess.run(
        [sys.executable, str(ROOT / "scripts/zoology_reach.py"), *args, "--window", "32"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert "(out of reach): no queries" in wide.stdout and "Warning" not in wide.stderr


# ------------------------------------------------------------------ the positions each task gives


def test_zoology_recall_positions_name_each_pair_and_its_query():
    for sample in _samples(20):
        keys, values, queries = sample.recall_positions()
        for key, value, query in zip(keys, values, queries, strict=True):
            assert sample.ids[query] == sample.ids[key]  # the key asked again
            assert sample.targets[query + 1] == sample.ids[value]  # answered by its value
            assert sample.loss_mask[query + 1]  # and scored there


def test_induction_recall_positions_are_the_trigger_its_letter_and_the_last_token():
    task = InductionConfig(vocab=8, length=40)
    for index in range(20):
        sample = induction_sample(task, 3, index)
        (key,), (value,), (query,) = sample.recall_positions()
        assert sample.ids[key] == sample.ids[query] == 0  # the trigger, twice
        assert query == task.length - 1  # the last input token
        assert sample.ids[-1] == sample.ids[value]  # the answer: the letter after the first trigger


def test_the_induction_circuit_reads_one_where_the_maps_hold_it_and_zero_one_off():
    task = InductionConfig(vocab=8, length=40)
    samples = [induction_sample(task, 3, i) for i in range(6)]

    def maps(offset: int):
        first, last = _uniform(len(samples), 2, task.length), _uniform(len(samples), 2, task.length)
        for row, sample in enumerate(samples):
            letter = sample.trigger_at + 1
            first[row, :, letter] = 0.0
            first[row, :, letter, letter - 1 + offset] = 1.0
            last[row, :, -1] = 0.0
            last[row, :, -1, letter + offset] = 1.0
        return [first, last]

    assert recall_circuit(maps(0), samples) == RecallCircuit(1.0, 1.0)
    assert recall_circuit(maps(1), samples) == RecallCircuit(0.0, 0.0)


def test_evaluation_reports_the_circuit_or_why_it_has_none(monkeypatch):
    task = InductionConfig(vocab=8, length=24)
    samples = [induction_sample(task, 5, i) for i in range(4)]
    config = ModelConfig(vocab_size=8, block_size=24, n_layer=2, n_head=2, d_model=16, positions="rope")
    model = Transformer(config).eval()
    x, _ = toy_batch(samples, None, task.pad_id)
    expected = recall_circuit(model.attention_maps(x), samples)
    assert task_recall_circuit(model, samples, task.pad_id) == {**expected.to_dict(), "samples": 4}

    def no_maps(idx):
        raise NotImplementedError("attention kind Mine has no materialised softmax map")

    monkeypatch.setattr(model, "attention_maps", no_maps)
    assert task_recall_circuit(model, samples, task.pad_id) == {
        "skipped": "attention kind Mine has no materialised softmax map"
    }


def test_a_gdn_model_has_no_circuit_to_read():
    task = InductionConfig(vocab=8, length=24)
    samples = [induction_sample(task, 5, i) for i in range(2)]
    config = ModelConfig(
        vocab_size=8,
        block_size=24,
        n_layer=2,
        n_head=2,
        d_model=16,
        attention={"kind": "mha", "layers": ["mha", "gdn"]},
    )
    assert task_recall_circuit(Transformer(config).eval(), samples, task.pad_id) == {
        "skipped": "a gdn layer forms no softmax map; the circuit is attention's"
    }
