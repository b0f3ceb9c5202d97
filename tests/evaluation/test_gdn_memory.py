"""scripts/gdn_memory.py: the decay each gdn layer applies, read where it is known by construction."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import torch

from minitx.config import ModelConfig
from minitx.model import Transformer

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("gdn_memory", ROOT / "scripts/gdn_memory.py")
gdn_memory = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gdn_memory)


def known_decay_model(decay: bool = True, rate: float = 2.0, step: float = 0.1) -> Transformer:
    """Two gdn layers whose g is -rate * step at every token: A = rate, softplus(dt_bias) = step,
    and no input term (a_proj zero)."""
    config = ModelConfig(
        vocab_size=64,
        block_size=32,
        n_layer=2,
        n_head=1,
        d_model=16,
        mlp="none",
        attention={"kind": "gdn", "options": {"gdn": {"decay": decay}}},
    )
    model = Transformer(config).eval()
    if decay:
        with torch.no_grad():
            for block in model.blocks:
                block.attn.A_log.fill_(math.log(rate))
                block.attn.dt_bias.fill_(math.log(math.expm1(step)))  # softplus^-1(step)
                block.attn.a_proj.weight.zero_()
    return model


def test_each_layer_s_decay_is_read_as_built():
    model = known_decay_model(rate=2.0, step=0.1)
    decays = gdn_memory.layer_decays(model, torch.randint(0, 64, (3, 20)))
    assert len(decays) == 2
    for g in decays:
        assert g.shape == (3, 20)
        assert torch.allclose(g, torch.full_like(g, -0.2))
    assert gdn_memory.layer_decays(known_decay_model(decay=False), torch.randint(0, 64, (1, 5))) == []


def save(model: Transformer, path: Path) -> None:
    tokenizer = {"kind": "char", "chars": [chr(0x4E00 + t) for t in range(64)]}
    minitx = {"format": 1, "model_config": model.config.to_dict(), "tokenizer": tokenizer}
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save({"state_dict": state, "minitx": minitx}, path)


def run_script(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts/gdn_memory.py"), "ckpt", "--ckpt", str(path)]
        + ["--vocab", "64", "--pairs", "4", "--seq-len", "32", "--samples", "6"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_the_script_reports_each_layer_s_memory(tmp_path):
    save(known_decay_model(rate=2.0, step=0.1), tmp_path / "decay.ckpt")
    out = run_script(tmp_path / "decay.ckpt")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["gdn layer 0", "gdn layer 1"]
    assert "pairs -0.2000, filler -0.2000, queries -0.2000; memory 1/-g 5.0 tokens" in lines[0]


def test_the_script_refuses_a_model_without_decay_in_one_line(tmp_path):
    save(known_decay_model(decay=False), tmp_path / "deltanet.ckpt")
    out = run_script(tmp_path / "deltanet.ckpt")
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "gdn_memory: the checkpoint has no gdn layer with decay (DeltaNet forgets nothing)"
    ]
