"""Config validation: each mistake raises a ValueError that names the field to fix."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest

from minitx import AttentionConfig, ModelConfig
from minitx.files.upgrade import upgrade_checkpoint
from minitx.kinds import registry


def model(n_layer: int = 4, n_head: int = 4, d_model: int = 32, **attention) -> ModelConfig:
    return ModelConfig(
        n_layer=n_layer, n_head=n_head, d_model=d_model, attention=AttentionConfig(**attention)
    )


BAD_CONFIGS = {
    "n_head not divisible by n_kv_head": (dict(kind="gqa", n_kv_head=3), "attention.n_kv_head"),
    "more kv heads than heads": (dict(kind="gqa", n_kv_head=8), "attention.n_kv_head"),
    "n_kv_head below 1": (dict(kind="gqa", n_kv_head=0), "attention.n_kv_head"),
    "n_kv_head with mha": (dict(kind="mha", n_kv_head=2), "attention.n_kv_head"),
    "n_kv_head with mqa": (dict(kind="mqa", n_kv_head=1), "attention.n_kv_head"),
    "local kv heads per layer": (dict(layers=["local", "mha"], n_kv_head=3), "attention.n_kv_head"),
    "window below 1": (
        dict(kind="local", options={"local": {"window": 0}}),
        "attention.options.local.window",
    ),
    "negative globals": (
        dict(kind="local", options={"local": {"n_global": -1}}),
        "attention.options.local.n_global",
    ),
    "even mta key kernel": (
        dict(kind="mta", options={"mta": {"key_kernel": 10}}),
        "attention.options.mta.key_kernel",
    ),
    "mta query kernel below 1": (
        dict(kind="mta", options={"mta": {"query_kernel": 0}}),
        "attention.options.mta.query_kernel",
    ),
    "mta conv layer out of range": (
        dict(kind="mta", options={"mta": {"conv_layers": [1, 4]}}),
        "attention.options.mta.conv_layers",
    ),
    "mta conv layer negative": (
        dict(kind="mta", options={"mta": {"conv_layers": [-1]}}),
        "attention.options.mta.conv_layers",
    ),
    "mta head group not dividing heads": (
        dict(kind="mta", options={"mta": {"head_group": 3}}),
        "attention.options.mta.head_group",
    ),
    "mta query chunk below 1": (
        dict(kind="mta", options={"mta": {"query_chunk": 0}}),
        "attention.options.mta.query_chunk",
    ),
    "unknown conv placement": (
        dict(kind="mta", options={"mta": {"conv_placement": "middle"}}),
        "attention.options.mta.conv_placement",
    ),
    "unknown head mix": (
        dict(kind="mta", options={"mta": {"head_mix": "all"}}),
        "attention.options.mta.head_mix",
    ),
    "unknown kind": (dict(kind="sparse"), "attention.kind"),
    "unknown layers entry": (dict(layers=["mha", "linear"]), r"attention.layers\[1\]"),
    "empty layers": (dict(layers=[]), "attention.layers"),
    "unknown local backend": (
        dict(kind="local", options={"local": {"backend": "triton"}}),
        "attention.options.local.backend",
    ),
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


@pytest.mark.parametrize("field", ["dropout", "embed_dropout", "attn_dropout", "resid_dropout"])
@pytest.mark.parametrize("value", [-0.1, 1.0, "0.1", True])
def test_bad_dropout_names_its_place(field, value):
    with pytest.raises(ValueError, match=f"^{field}: is .*use a probability in \\[0, 1\\)"):
        ModelConfig(**{field: value})


def test_each_dropout_place_falls_back_to_dropout():
    config = ModelConfig(dropout=0.2, attn_dropout=0.1, resid_dropout=0.0)
    assert [config.dropout_at(place) for place in ("embed", "attn", "resid")] == [0.2, 0.1, 0.0]
    assert ModelConfig.from_dict(config.to_dict()) == config
    older = {k: v for k, v in config.to_dict().items() if not k.endswith("_dropout")}  # before the split
    assert all(ModelConfig.from_dict(older).dropout_at(place) == 0.2 for place in ("embed", "attn", "resid"))


def test_message_is_one_line_with_a_fix():
    with pytest.raises(ValueError) as error:
        model(kind="gqa", n_kv_head=3)
    message = str(error.value)
    assert "\n" not in message and "; " in message  # "<field>: <problem>; <fix>"


def test_good_configs_pass_and_derive_per_layer_values():
    config = model(
        n_layer=5, layers=["local", "local", "gqa"], n_kv_head=2, options={"local": {"window": 16}}
    )
    assert config.layer_kinds == ["local", "local", "gqa", "local", "local"]
    assert [config.n_kv_head_at(layer) for layer in range(5)] == [2] * 5
    mixed = model(n_layer=2, layers=["mha", "mqa"])
    assert [mixed.n_kv_head_at(layer) for layer in range(2)] == [4, 1]
    assert model(n_layer=12, kind="mta").attention.options_of("mta").conv_layer_set(12) == {2, 6, 10}


def test_round_trip_through_dict():
    config = model(kind="mta", options={"mta": {"conv_layers": [0, 3], "head_group": 2}}, n_kv_head=2)
    assert ModelConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="unknown field"):
        ModelConfig.from_dict({**config.to_dict(), "n_heads": 4})


def test_registry_holds_the_five_kinds_and_config_reads_it():
    assert {"mha", "mqa", "gqa", "local", "mta"} <= set(registry)
    assert all(spec.name == name for name, spec in registry.items())


# -- options belong to kinds ---------------------------------------------------------------------------

REFUSED = {
    "window on mha": (
        dict(kind="mha", options={"local": {"window": 64}}),
        "attention.options.local",
        "mha",
    ),
    "n_global on gqa": (
        dict(kind="gqa", options={"local": {"n_global": 2}}),
        "attention.options.local",
        "gqa",
    ),
    "mta kernel on gqa": (
        dict(kind="gqa", options={"mta": {"query_kernel": 3}}),
        "attention.options.mta",
        "gqa",
    ),
    "mta output norm on local": (
        dict(kind="local", options={"mta": {"output_norm": False}}),
        "attention.options.mta",
        "local",
    ),
    "local backend on mixed mta+mha": (
        dict(layers=["mta", "mha"], options={"local": {"backend": "chunked"}}),
        "attention.options.local",
        "mta/mha",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_option_no_layer_reads_is_refused_naming_option_and_kind(case):
    attention, field, kinds = REFUSED[case]
    with pytest.raises(ValueError) as error:
        model(**attention)
    message = str(error.value)
    assert message.startswith(f"{field}: ") and f"of kind {kinds};" in message and "\n" not in message


def test_option_read_by_some_layer_of_a_mixed_model_is_accepted():
    config = model(layers=["local", "mha"], options={"local": {"window": 8, "n_global": 1}})
    assert config.layer_kinds == ["local", "mha", "local", "mha"]
    model(layers=["mta", "gqa"], n_kv_head=2, options={"mta": {"query_kernel": 2}})


def test_options_at_their_defaults_are_accepted_for_any_kind():
    # jsonargparse and checkpoints hand over every field, defaults included.
    defaults = dataclasses.asdict(AttentionConfig())
    for kind in registry:
        model(**dict(defaults, kind=kind))


def yaml_attention_sections():
    """(where, attention dict) of each config file's model.attention and of each ablation variant."""
    import yaml

    root = Path(__file__).resolve().parents[2] / "configs"
    for path in sorted(root.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        base = dict((data.get("model") or {}).get("attention") or {})
        yield path.name, base
        for variant in data.get("variants") or []:
            attention = copy.deepcopy(base)
            for key, value in (variant.get("overrides") or {}).items():
                if key.startswith("model.attention."):  # dotted: model.attention.options.local.window
                    *sections, last = key.split(".")[2:]
                    inner = attention
                    for section in sections:
                        inner = inner.setdefault(section, {})
                    inner[last] = value
            yield f"{path.name}:{variant['name']}", attention


def test_every_shipped_config_still_loads():
    sections = list(yaml_attention_sections())
    assert len(sections) > 10
    for where, attention in sections:
        try:
            model(n_layer=4, **attention)
        except ValueError as error:
            pytest.fail(f"{where}: {error}")


def test_stored_config_drops_options_its_kinds_do_not_read():
    # A checkpoint's config may carry another version's default for an option its kinds never
    # read (here MTA's backend on an MHA model): it loads, while a user writing it is refused.
    stored = ModelConfig(attention=AttentionConfig(kind="mha")).to_dict()
    stored["attention"]["mta_backend"] = "factorised"
    stored["attention"]["window"] = 7
    assert ModelConfig.from_dict(upgraded(stored)).attention == AttentionConfig(kind="mha")
    with pytest.raises(
        ValueError, match="attention.options.mta: sets options of kind mta, but the layers are of kind mha"
    ):
        AttentionConfig(kind="mha", options={"mta": {"backend": "factorised"}})
    # Options a layer does read are kept.
    stored["attention"].update(kind="local", layers=["local", "mha"])
    assert ModelConfig.from_dict(upgraded(stored)).attention.options_of("local").window == 7


def upgraded(model_config: dict) -> dict:
    """A checkpoint's model config as read_checkpoint reads it (minitx/files/upgrade.py)."""
    return upgrade_checkpoint({"format": 1, "model_config": model_config}, "here")["model_config"]


@pytest.mark.parametrize(
    "name, value, choices",
    [
        ("mlp", "relu", "gelu, swiglu, none"),
        ("norm", "batchnorm", "rmsnorm, layernorm"),
        ("positions", "alibi", "rope, learned"),
    ],
)
def test_a_choice_not_in_its_literal_is_refused_naming_the_choices(name, value, choices):
    with pytest.raises(ValueError, match=f"^{name}: unknown value '{value}'; choose one of {choices}$"):
        ModelConfig(**{name: value})
