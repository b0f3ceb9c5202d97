"""evaluate.py --attention-maps: every layer and head over a prompt, in one PNG."""

from __future__ import annotations

import torch
from matplotlib.image import imread

from minitx.cli import eval_main
from minitx.config import AttentionConfig, ModelConfig
from minitx.data.tokenizer import tokenizer_from_dict
from minitx.evaluation import attention_maps
from minitx.model import Transformer


def _checkpoint(tmp_path, attention: dict | None = None):
    text = "ROMEO:\nBut, soft! what light through yonder window breaks?"
    tokenizer = tokenizer_from_dict({"kind": "char", "chars": sorted(set(text))})
    attention = attention or dict(layers=["local", "mha"], options={"local": {"window": 4}})
    config = ModelConfig(
        n_layer=len(attention["layers"]),
        n_head=2,
        d_model=16,
        block_size=64,
        vocab_size=tokenizer.vocab_size,
        attention=AttentionConfig(**attention),
    )
    model = Transformer(config)
    path = tmp_path / "tiny.ckpt"
    torch.save(
        {
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "minitx": {"format": 1, "model_config": config.to_dict(), "tokenizer": tokenizer.to_dict()},
        },
        path,
    )
    return path


def test_maps_draw_every_layer_and_head_through_the_materialised_attention(tmp_path, capsys, monkeypatch):
    ckpt = _checkpoint(tmp_path)
    seen = []
    original = Transformer.attention_maps

    def spy(self, idx):
        maps = original(self, idx)
        seen.append([tuple(m.shape) for m in maps])
        return maps

    monkeypatch.setattr(Transformer, "attention_maps", spy)
    out = tmp_path / "maps.png"
    assert (
        eval_main(["--ckpt", str(ckpt), "--attention-maps", str(out), "--attention-prompt", "ROMEO:\nBut"])
        == 0
    )
    assert seen == [[(1, 2, 10, 10), (1, 2, 10, 10)]]
    assert imread(out).shape[0] > 100
    printed = capsys.readouterr().out
    assert "2 layers (local, mha) x 2 heads over 10 tokens" in printed


def test_a_hybrid_draws_its_gdn_layers_linear_map_beside_the_softmax_weights(tmp_path, capsys, monkeypatch):
    """A gdn layer has no softmax map: it draws the linear map it applies to its values
    (GatedDeltaNet.attention_weights, signed: a diverging scale), one per value head."""
    attention = dict(layers=["gdn", "gdn", "mha"], options={"gdn": {"n_value_head": 4, "chunk_size": 4}})
    ckpt = _checkpoint(tmp_path, attention)
    drawn = []
    original = Transformer.attention_maps
    monkeypatch.setattr(
        Transformer, "attention_maps", lambda self, idx: drawn.append(original(self, idx)) or drawn[-1]
    )
    out = tmp_path / "maps.png"
    assert (
        eval_main(["--ckpt", str(ckpt), "--attention-maps", str(out), "--attention-prompt", "ROMEO:\nBut"])
        == 0
    )
    maps = drawn[0]
    assert [tuple(m.shape) for m in maps] == [(1, 4, 10, 10), (1, 4, 10, 10), (1, 2, 10, 10)]
    assert (maps[0] < 0).any() and maps[0].triu(1).abs().max() == 0  # signed, causal
    assert imread(out).shape[0] > 100
    assert "3 layers (gdn, gdn, mha) x 4 heads over 10 tokens" in capsys.readouterr().out


def test_maps_refuse_a_bad_output_or_prompt_in_one_line(tmp_path, capfd):
    ckpt = _checkpoint(tmp_path)
    for args, expected in (
        (["--attention-maps", str(tmp_path)], "is a directory"),
        (["--attention-maps", str(tmp_path / "no" / "maps.png")], "does not exist"),
        (["--attention-maps", str(tmp_path / "maps.jpg")], "ending in .png"),
        (["--attention-maps", str(tmp_path / "m.png"), "--attention-prompt", "ZZZ"], "--attention-prompt"),
    ):
        assert eval_main(["--ckpt", str(ckpt), *args]) == 2
        err = capfd.readouterr().err.strip()
        assert expected in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "m.png").exists()
    assert attention_maps.DEFAULT_PROMPT.startswith("ROMEO:")


def test_a_prompt_longer_than_block_size_is_cut_with_a_line_saying_so(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path)  # block_size 64
    prompt = "ROMEO:\nBut, soft! " * 6  # 108 characters
    out = tmp_path / "long.png"
    assert eval_main(["--ckpt", str(ckpt), "--attention-maps", str(out), "--attention-prompt", prompt]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert (
        printed[0]
        == "--attention-prompt: 108 tokens, longer than block_size=64: its first 44 left out, the last 64 drawn"
    )
    assert "over 64 tokens" in printed[1]
    # One within block_size says nothing of the kind.
    assert eval_main(["--ckpt", str(ckpt), "--attention-maps", str(out), "--attention-prompt", "ROMEO:"]) == 0
    assert "block_size" not in capsys.readouterr().out


def test_the_header_says_which_layers_read_positions():
    from minitx.evaluation.report import table

    def header(kinds, positions="rope"):
        model = {"positions": positions, "block_size": 8, "layers": kinds}
        result = {"checkpoint": "c", "model": model, "text": "t", "tokens": 1, "context": 8, "stride": 8}
        return table({**result, "loss": 1.0, "perplexity": 2.7, "bits_per_char": 1.4}).splitlines()[0]

    assert "no positions (gdn: order comes from the recurrence)" in header(["gdn", "gdn"])
    assert "rope positions (gdn layers have none" in header(["gdn", "mha"])
    assert "c: rope positions, block_size" in header(["mha", "local"])
    assert "learned positions" in header(["gdn"], "learned")
