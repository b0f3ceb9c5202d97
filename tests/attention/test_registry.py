"""A sixth attention kind, added from this file alone: a layer, its options and one registry line.

QK-norm (queries and keys RMS-normalised per head before the scores, as in OLMo 2 and Gemma 3)
is grouped-query attention with a different projection, so it reuses everything else: the fast
path, the reference, the cache. Its one option (the norm's eps) is checked by its own dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import minitx
from minitx import AttentionConfig, ModelConfig, Transformer
from minitx.attention.grouped import GroupedQueryAttention
from minitx.decoding.loop import generate
from minitx.kinds import KindSpec, register, registry
from minitx.options import OptionError

pytestmark = pytest.mark.usefixtures("seed", "one_thread")


@dataclass
class QKNormOptions:
    eps: float = 1e-6

    def __post_init__(self):
        if not self.eps > 0:
            raise OptionError("eps", f"is {self.eps}", "use a small positive number")


class QKNormAttention(GroupedQueryAttention):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__(config, layer)
        eps = config.options_at(layer).eps
        self.q_norm = nn.RMSNorm(self.head_dim, eps=eps)
        self.k_norm = nn.RMSNorm(self.head_dim, eps=eps)

    def project(self, x, rope):
        q, k, v = super().project(x, rope)
        return self.q_norm(q), self.k_norm(k), v


QKNORM = KindSpec("qknorm", QKNormAttention, options=QKNormOptions)


@pytest.fixture
def qknorm():
    register(QKNORM)  # the one registry line; the fixture takes it out again
    yield
    del registry["qknorm"]


def config(**attention) -> ModelConfig:
    return ModelConfig(
        vocab_size=32, block_size=16, n_layer=2, n_head=4, d_model=32, attention=AttentionConfig(**attention)
    )


def test_new_kind_trains_a_step_through_the_transformer(qknorm):
    model = Transformer(config(kind="qknorm", n_kv_head=2))
    assert isinstance(model.blocks[0].attn, QKNormAttention) and model.config.n_kv_head_at(1) == 2
    x = torch.randint(0, 32, (4, 16))
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(3):
        loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert model.blocks[0].attn.q_norm.weight.grad.abs().sum() > 0  # the new part is trained
    assert losses[-1] < losses[0]


def test_new_kind_decodes_with_the_cache_it_inherits(qknorm):
    model = Transformer(config(layers=["qknorm", "local"], options={"local": {"window": 4}})).eval()
    seq = torch.randint(0, 32, (2, 16))
    expected = model(seq)
    cache = model.new_cache(batch=2, max_len=16)  # each layer makes its own
    steps = [model(seq[:, :3], cache)] + [model(seq[:, t : t + 1], cache) for t in range(3, 16)]
    assert (torch.cat(steps, dim=1) - expected).abs().max() < 1e-5
    assert minitx.kv_cache_bytes(model.config, 16) == model.new_cache(1, 16).nbytes()
    prompt = seq[:, :3]  # and through the decode loop, sliding past block_size
    assert generate(model, prompt, 20, temperature=0).shape == (2, 23)


def test_new_kind_reads_and_checks_its_own_options(qknorm):
    model = Transformer(config(kind="qknorm", options={"qknorm": {"eps": 1e-3}}))
    assert model.blocks[1].attn.q_norm.eps == 1e-3
    assert Transformer(config(kind="qknorm")).blocks[0].attn.k_norm.eps == 1e-6  # the default
    with pytest.raises(ValueError, match=r"^attention\.options\.qknorm\.eps: is -1.0; use a small positive"):
        config(kind="qknorm", options={"qknorm": {"eps": -1}})
    with pytest.raises(ValueError, match=r"^attention\.options\.qknorm\.esp: .*did you mean eps"):
        config(kind="qknorm", options={"qknorm": {"esp": 1e-3}})
    with pytest.raises(ValueError, match=r"^attention\.options\.local: .*layers are of kind qknorm"):
        config(kind="qknorm", options={"local": {"window": 8}})


def test_new_kind_trains_a_step_in_the_lightning_module(qknorm):
    training = pytest.importorskip("minitx.training")
    module = training.MinitxLM(
        vocab_size=32, block_size=16, n_layer=1, n_head=4, d_model=32, attention=dict(kind="qknorm")
    )
    x = torch.randint(0, 32, (2, 16))
    loss = module.loss(x[:, :-1], x[:, 1:])
    loss.backward()
    assert module.model.blocks[0].attn.k_norm.weight.grad is not None


def test_unregistered_kind_is_refused_with_the_registered_ones():
    with pytest.raises(
        ValueError, match=r"^attention\.kind: unknown kind 'qknorm'; choose one of mha, mqa, gqa, local, mta"
    ):
        config(kind="qknorm")


class HalfALayer(minitx.KindLayer):
    """A kind that forgot make_cache and flops_per_token."""

    def forward(self, x, rope=None, cache=None, docs=None):
        return x


def test_every_built_in_kind_has_what_kind_layer_declares():
    for name, spec in registry.items():
        assert issubclass(spec.module, minitx.KindLayer) and spec.module.missing() == [], name
    for kind in ("mha", "mla", "gdn", "mta", "diff", "local"):
        layer = Transformer(config(kind=kind)).blocks[0].attn
        assert layer.n_head == 4, kind  # sdpa_flops reads it of every kind
        weights = layer.attention_weights(torch.randn(1, 5, 32))  # project + reference, or its own
        assert weights.shape[0] == 1 and weights.shape[-2:] == (5, 5), kind  # diff: half the heads


def test_a_layer_class_that_leaves_out_the_interface_is_refused_at_build():
    register(KindSpec("half", HalfALayer))
    register(KindSpec("plain", nn.Identity))
    try:
        assert HalfALayer.missing() == ["make_cache", "flops_per_token"]
        with pytest.raises(
            TypeError,
            match=r"^attention kind half: .*HalfALayer does not implement make_cache, flops_per_token",
        ):
            Transformer(config(kind="half"))
        with pytest.raises(
            TypeError, match=r"^attention kind plain: .*Identity.* is not a subclass of minitx\.KindLayer"
        ):
            Transformer(config(kind="plain"))
    finally:
        del registry["half"], registry["plain"]
