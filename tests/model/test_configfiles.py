"""Config files as the train command reads them: overlays on a base, attention options merged."""

from __future__ import annotations

import json

import pytest
import yaml

from minitx.cli import train_main
from minitx.errors import UserError
from minitx.files.configs import DEFAULT_CONFIG, REPO_ROOT, CommandLine, merged, merged_config
from minitx.training.command import checked_config

KIND_FILES = ["mha", "mqa", "gqa", "local", "mta", "gdn"]


def options_flag(line: CommandLine) -> dict | None:
    """The merged options flag CommandLine.read appends (None when nothing set options)."""
    args = line.args
    if "--model.attention.options" not in args:
        return None
    return json.loads(args[args.index("--model.attention.options") + 1])


def test_no_config_trains_the_default_and_a_base_is_read_first(tmp_path):
    default = CommandLine.read(["--trainer.max_steps", "5"], default_config=True)
    assert default.args[:2] == ["--config", str(DEFAULT_CONFIG)] and default.files == [str(DEFAULT_CONFIG)]
    base = tmp_path / "base.yaml"
    base.write_text("model: {n_layer: 2}\n")
    middle = tmp_path / "sub" / "middle.yaml"
    middle.parent.mkdir()
    middle.write_text("base: ../base.yaml\nmodel: {n_head: 2}\n")
    top = tmp_path / "top.yaml"
    top.write_text("base: sub/middle.yaml\nmodel: {d_model: 32}\n")
    line = CommandLine.read(["--config", str(top), "--model.n_layer", "3"])
    args = line.args
    files = [args[i + 1] for i, a in enumerate(args) if a == "--config"]
    assert (
        [p.split("/")[-1] for p in files]
        == ["base.yaml", "middle.yaml", "top.yaml"]
        == [p.split("/")[-1] for p in line.files]
    )
    assert args[-4:-2] == ["--model.n_layer", "3"]  # flags keep their place after the files
    assert args[-2:] == ["--base", "null"]  # the bases are read: the resolved config names none
    assert merged_config(top) == {"model": {"n_layer": 2, "n_head": 2, "d_model": 32}}


def test_base_mistakes_are_one_line(tmp_path):
    loop = tmp_path / "a.yaml"
    loop.write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(UserError, match="leads back to a file already read"):
        CommandLine.read(["--config", str(loop)])
    missing = tmp_path / "c.yaml"
    missing.write_text("base: nowhere.yaml\n")
    with pytest.raises(UserError, match="base 'nowhere.yaml' is not a file .*relative to the file naming it"):
        CommandLine.read(["--config", str(missing)])
    with pytest.raises(UserError, match="^--base: only a config file names its base"):
        CommandLine.read(["--base", "configs/default.yaml"], default_config=True)


@pytest.mark.parametrize("name", KIND_FILES)
def test_each_kind_file_is_the_default_run_with_its_attention(name):
    """configs/<kind>.yaml states only its attention section; everything else is default.yaml's."""
    overlay = yaml.safe_load((REPO_ROOT / "configs" / f"{name}.yaml").read_text())
    assert overlay["base"] == "default.yaml" and set(overlay) == {"base", "model"}
    assert set(overlay["model"]) == {"attention"}
    parsed = checked_config(CommandLine.read(["--config", f"configs/{name}.yaml"]))
    default = checked_config(CommandLine.read([], default_config=True))
    for section in ("data", "trainer"):
        assert parsed[section] == default[section], section
    assert {k: v for k, v in parsed["model"].items() if k != "attention"} == {
        k: v for k, v in default["model"].items() if k != "attention"
    }
    assert parsed["model"]["attention"]["kind"] == name


# The variant files: the default run with one variant; those exported natively also take the MLP
# of their reference architecture (SwiGLU), so their checkpoints export without custom code.
VARIANT_FILES = {
    "mla": ("mla", {"kv_lora_rank": 64, "qk_rope_head_dim": 16}, "swiglu"),
    "diff": ("diff", {"lambda_init": None, "lambda_std": 0.1}, "swiglu"),
    "qknorm": ("mha", {"qk_norm": True}, "swiglu"),
    "sinks": ("mha", {"sinks": True}, None),
    "gated": ("mha", {"gate": "elementwise"}, None),
}


@pytest.mark.parametrize("name", VARIANT_FILES)
def test_each_variant_file_is_the_default_run_with_its_variant(name):
    kind, options, mlp = VARIANT_FILES[name]
    overlay = yaml.safe_load((REPO_ROOT / "configs" / f"{name}.yaml").read_text())
    assert overlay["base"] == "default.yaml" and set(overlay) == {"base", "model"}
    parsed = checked_config(CommandLine.read(["--config", f"configs/{name}.yaml"]))
    default = checked_config(CommandLine.read([], default_config=True))
    for section in ("data", "trainer"):
        assert parsed[section] == default[section], section
    changed = {k for k, v in parsed["model"].items() if v != default["model"][k]}
    assert changed == {"attention"} | ({"mlp"} if mlp else set())
    assert parsed["model"]["mlp"] == (mlp or default["model"]["mlp"])
    attention = parsed["model"]["attention"]
    assert attention["kind"] == kind
    assert options.items() <= attention["options"][kind].items()


def test_the_hybrid_file_is_the_default_run_with_three_gdn_layers_to_one_gated_softmax():
    overlay = yaml.safe_load((REPO_ROOT / "configs" / "hybrid.yaml").read_text())
    assert overlay["base"] == "default.yaml" and set(overlay) == {"base", "model"}
    parsed = checked_config(CommandLine.read(["--config", "configs/hybrid.yaml"]))
    default = checked_config(CommandLine.read([], default_config=True))
    for section in ("data", "trainer"):
        assert parsed[section] == default[section], section
    assert {k for k, v in parsed["model"].items() if v != default["model"][k]} == {"attention"}
    attention = parsed["model"]["attention"]
    assert attention["layers"] == ["gdn", "gdn", "gdn", "mha"]
    assert attention["options"]["mha"]["qk_norm"] and attention["options"]["mha"]["gate"] == "elementwise"


def test_an_option_flag_changes_one_option_and_keeps_the_others():
    # LightningCLI alone would replace all of options.mta with {query_kernel: 3}.
    args = CommandLine.read(
        ["--config", "configs/mta.yaml", "--model.attention.options.mta.query_kernel", "3"]
    )
    released = yaml.safe_load((REPO_ROOT / "configs" / "mta.yaml").read_text())["model"]["attention"][
        "options"
    ]
    assert options_flag(args) == {"mta": dict(released["mta"], query_kernel=3)}
    parsed = checked_config(args)["model"]["attention"]["options"]["mta"]
    assert parsed["query_kernel"] == 3 and parsed["conv_layers"] == [2] and parsed["conv_placement"] == "both"


def test_options_merge_in_the_order_given(tmp_path):
    later = tmp_path / "later.yaml"
    later.write_text("model: {attention: {options: {mta: {key_kernel: 5, head_mix: pre}}}}\n")
    line = CommandLine.read(
        ["--config", "configs/mta.yaml", "--model.attention.options.mta.key_kernel=7", "--config", str(later)]
        + [
            "--model.attention.options.mta",
            "{head_mix: none}",
            "--model.attention.options={local: {window: 4}}",
        ]
    )
    options = options_flag(line)
    assert options == line.options
    assert options["mta"]["key_kernel"] == 5  # the later file wins over the earlier flag
    assert options["mta"]["head_mix"] == "none" and options["mta"]["query_kernel"] == 6
    assert options["local"] == {"window": 4}
    assert options_flag(CommandLine.read(["--config", "configs/default.yaml"])) is None  # untouched
    assert options_flag(CommandLine.read(line.args)) == options  # the words read again: the same


def test_merged_keeps_what_the_change_does_not_name():
    base = {"kind": "mta", "options": {"mta": {"query_kernel": 3, "key_kernel": 5}}}
    changed = merged(base, options={"mta": {"key_kernel": 7}}, n_kv_head=2)
    assert changed == {
        "kind": "mta",
        "n_kv_head": 2,
        "options": {"mta": {"query_kernel": 3, "key_kernel": 7}},
    }
    assert base["options"]["mta"]["key_kernel"] == 5  # a copy


def test_a_printed_config_of_an_overlay_trains_from_anywhere(tmp_path, capsys, monkeypatch):
    """--print_config of configs/mta.yaml is the whole resolved config: saved elsewhere and given
    back as --config, it must not look for the overlay's base next to itself."""
    with pytest.raises(SystemExit) as done:
        train_main(["--config", "configs/mta.yaml", "--print_config"])
    assert not done.value.code
    printed = capsys.readouterr().out
    assert yaml.safe_load(printed)["base"] is None
    (tmp_path / "mta.yaml").write_text(printed)
    monkeypatch.chdir(tmp_path)
    again = checked_config(CommandLine.read(["--config", str(tmp_path / "mta.yaml")]))
    assert (
        again["model"]["attention"]
        == checked_config(CommandLine.read(["--config", str(REPO_ROOT / "configs" / "mta.yaml")]))["model"][
            "attention"
        ]
    )
