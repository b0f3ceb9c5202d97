"""Every fetch from the Hugging Face Hub fails in one line, exit 2, within seconds, offline:
declared (HF_HUB_OFFLINE=1) or with no route (a proxy nobody listens on)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from minitx.cli import eval_main, prepare_main

REPO = Path(__file__).resolve().parents[2]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again on leaving: connecting is refused at once


@pytest.fixture(params=["declared", "no route"])
def offline(request, monkeypatch):
    for name in (
        "HF_HUB_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    ):
        monkeypatch.delenv(name, raising=False)
    if request.param == "declared":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{_closed_port()}")
    return request.param


def _one_line_error(capfd) -> str:
    err = capfd.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def _checkpoint(path: Path) -> Path:
    import torch

    from minitx.config import ModelConfig
    from minitx.data.tokenizer import tokenizer_from_dict
    from minitx.model import Transformer

    tokenizer = tokenizer_from_dict({"kind": "char", "chars": list("abc ")})
    config = ModelConfig(n_layer=1, n_head=2, d_model=16, block_size=16, vocab_size=tokenizer.vocab_size)
    model = Transformer(config)
    torch.save(
        {
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "minitx": {"format": 1, "model_config": config.to_dict(), "tokenizer": tokenizer.to_dict()},
        },
        path,
    )
    return path


def test_lm_eval_tasks_offline(offline, tmp_path, capfd):
    pytest.importorskip("lm_eval")
    ckpt = _checkpoint(tmp_path / "tiny.ckpt")
    import minitx.hf.lm_eval_adapter  # noqa: F401 (imported ahead: the time is the check's, not the import's)

    started = time.monotonic()
    code = eval_main(["--ckpt", str(ckpt), "--lm-eval-tasks", "lambada_openai"])
    assert code == 2 and time.monotonic() - started < 5
    err = _one_line_error(capfd)
    assert "--lm-eval-tasks: lambada_openai" in err and "Hub" in err
    assert ("HF_HUB_OFFLINE is set" if offline == "declared" else "cannot be reached") in err


def test_hub_dataset_offline(offline, tmp_path, capfd):
    started = time.monotonic()
    code = prepare_main(
        ["--config", str(REPO / "configs" / "tinystories.yaml"), "--data.cache_dir", str(tmp_path / "cache")]
    )
    assert code == 2 and time.monotonic() - started < 15
    err = _one_line_error(capfd)
    assert "data.hf_name" in err and "roneneldan/TinyStories" in err and "needs the network" in err
    assert not any((tmp_path / "cache").rglob("*.bin"))
