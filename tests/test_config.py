"""Config validation: each mistake raises a ValueError that names the field to fix."""

from __future__ import annotations

import pytest

from minitx import AttentionConfig, ModelConfig
from minitx.attention import registry


def model(n_layer: int = 4, n_head: int = 4, d_model: int = 32, **attention) -> ModelConfig:
    return ModelConfig(n_layer=n_layer, n_head=n_head, d_model=d_model, attention=AttentionConfig(**attention))


BAD_CONFIGS = {
    "n_head not divisible by n_kv_head": (dict(kind="gqa", n_kv_head=3), "attention.n_kv_head"),
    "more kv heads than heads": (dict(kind="gqa", n_kv_head=8), "attention.n_kv_head"),
    "n_kv_head below 1": (dict(kind="gqa", n_kv_head=0), "attention.n_kv_head"),
    "n_kv_head with mha": (dict(kind="mha", n_kv_head=2), "attention.n_kv_head"),
    "n_kv_head with mqa": (dict(kind="mqa", n_kv_head=1), "attention.n_kv_head"),
    "local kv heads per layer": (dict(layers=["local", "mha"], n_kv_head=3), "attention.n_kv_head"),
    "window below 1": (dict(kind="local", window=0), "attention.window"),
    "negative globals": (dict(kind="local", n_global=-1), "attention.n_global"),
    "even mta key kernel": (dict(kind="mta", mta_key_kernel=10), "attention.mta_key_kernel"),
    "mta query kernel below 1": (dict(kind="mta", mta_query_kernel=0), "attention.mta_query_kernel"),
    "mta conv layer out of range": (dict(kind="mta", mta_conv_layers=[1, 4]), "attention.mta_conv_layers"),
    "mta conv layer negative": (dict(kind="mta", mta_conv_layers=[-1]), "attention.mta_conv_layers"),
    "mta head group not dividing heads": (dict(kind="mta", mta_head_group=3), "attention.mta_head_group"),
    "mta query chunk below 1": (dict(kind="mta", mta_query_chunk=0), "attention.mta_query_chunk"),
    "unknown conv placement": (dict(kind="mta", mta_conv_placement="middle"), "attention.mta_conv_placement"),
    "unknown head mix": (dict(kind="mta", mta_head_mix="all"), "attention.mta_head_mix"),
    "unknown kind": (dict(kind="sparse"), "attention.kind"),
    "unknown layers entry": (dict(layers=["mha", "linear"]), r"attention.layers\[1\]"),
    "empty layers": (dict(layers=[]), "attention.layers"),
    "unknown local backend": (dict(kind="local", local_backend="triton"), "attention.local_backend"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_attention_config_names_the_field(case):
    attention, field = BAD_CONFIGS[case]
    with pytest.raises(ValueError, match=f"^{field}:"):
        model(**attention)


@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(d_model=30, n_head=4), "d_model"),  # not divisible
        (dict(d_model=36, n_head=4), "d_model"),  # head dim 9 is odd: RoPE rotates pairs
        (dict(n_head=0), "n_head"),
        (dict(n_layer=0), "n_layer"),
    ],
)
def test_bad_model_config_names_the_field(fields, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        model(**fields)


def test_message_is_one_line_with_a_fix():
    with pytest.raises(ValueError) as error:
        model(kind="gqa", n_kv_head=3)
    message = str(error.value)
    assert "\n" not in message and "; " in message  # "<field>: <problem>; <fix>"


def test_good_configs_pass_and_derive_per_layer_values():
    config = model(n_layer=5, layers=["local", "local", "gqa"], n_kv_head=2, window=16)
    assert config.layer_kinds == ["local", "local", "gqa", "local", "local"]
    assert [config.n_kv_head_at(layer) for layer in range(5)] == [2] * 5
    mixed = model(n_layer=2, layers=["mha", "mqa"])
    assert [mixed.n_kv_head_at(layer) for layer in range(2)] == [4, 1]
    assert model(n_layer=12, kind="mta").attention.mta_conv_layer_set(12) == {2, 6, 10}


def test_round_trip_through_dict():
    config = model(kind="mta", mta_conv_layers=[0, 3], mta_head_group=2, n_kv_head=2)
    assert ModelConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="unknown field"):
        ModelConfig.from_dict({**config.to_dict(), "n_heads": 4})


def test_registry_holds_the_five_kinds_and_config_reads_it():
    assert {"mha", "mqa", "gqa", "local", "mta"} <= set(registry)
    assert all(spec.name == name for name, spec in registry.items())
