"""Logits at the scored positions only (Transformer.forward's `at`, MinitxLM.scored_logits) and
attention-only blocks (mlp: none)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minitx.config import ModelConfig
from minitx.data.toy import IGNORE_INDEX
from minitx.model import Transformer
from minitx.training.module import MinitxLM, lm_loss


def test_logits_at_equal_the_full_logits_there(seed, one_thread):
    for kind in ("mha", "gdn"):
        config = ModelConfig(
            vocab_size=37, block_size=23, n_layer=2, n_head=2, d_model=16, attention={"kind": kind}
        )
        model = Transformer(config).eval()
        x = torch.randint(0, 37, (3, 23))
        at = torch.rand(3, 23) < 0.3
        at[0] = False  # a row with nothing scored
        with torch.no_grad():
            full = model(x)
            assert torch.allclose(model(x, at=at), full[at], atol=1e-6)


def test_the_training_loss_is_the_same_from_the_scored_logits(seed, one_thread):
    module = MinitxLM(vocab_size=29, block_size=17, n_layer=1, n_head=2, d_model=16)
    x = torch.randint(0, 29, (4, 17))
    y = torch.randint(0, 29, (4, 17))
    with torch.no_grad():
        assert torch.equal(module.loss(x, y), lm_loss(module.model(x), y))  # all scored: the plain path
        y = y.masked_fill(torch.rand(4, 17) < 0.8, IGNORE_INDEX)
        expected = F.cross_entropy(module.model(x).flatten(0, 1), y.flatten(), ignore_index=IGNORE_INDEX)
        assert torch.allclose(module.loss(x, y), expected, atol=1e-6)


def test_attention_only_blocks_have_no_mlp(one_thread):
    config = ModelConfig(vocab_size=11, block_size=8, n_layer=2, n_head=1, d_model=8, mlp="none")
    model = Transformer(config)
    assert config.mlp_hidden == 0
    assert not any("mlp" in name or "norm2" in name for name, _ in model.named_parameters())
    x = torch.randint(0, 11, (2, 8))
    block = model.blocks[0]
    h = model.embed(x)
    rope = model.rope(0, 8)
    assert torch.allclose(block(h, rope), h + block.attn(block.norm1(h), rope))
