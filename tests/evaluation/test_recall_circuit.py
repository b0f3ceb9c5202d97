"""The recall circuit's two weights (minitx/evaluation/recall_circuit.py) read off hand-built
attention maps whose answer is known, and scripts/zoology_reach.py on a real checkpoint."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minitx.config import ModelConfig
from minitx.data.toy import toy_batch
from minitx.data.zoology import ZoologyConfig, zoology_sample
from minitx.evaluation.recall_circuit import recall_circuit
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
