"""The train command's precheck (minitx/training/precheck.py) refuses what LightningCLI refuses, with
the same line, and lets through what LightningCLI accepts: its keys and their types are
LightningCLI's, its answers on command lines of every form equal, bad values included (the value
checks are the settings' own, which LightningCLI's parse makes too). (That it imports no Lightning:
tests/project/test_startup.py.)"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Optional

import pytest
import yaml

from minitx.errors import UserError
from minitx.files.configs import DEFAULT_CONFIG, CommandLine
from minitx.training.command import checked_config
from minitx.training.precheck import (
    LINKED,
    check_arguments,
    help_text,
    light_parser,
    to_judge,
    trainer_argument_names,
)

ROOT = Path(__file__).resolve().parents[2]


def parser_keys(parser) -> dict[str, object]:
    """{key: its type} of every settable key of a jsonargparse parser (not the .help flags)."""
    keys = {}
    for action in parser._actions:
        hint = getattr(action, "_typehint", None)
        if type(action).__name__ == "ActionTypeHint":
            keys[action.dest] = hint
    return keys


@pytest.fixture(scope="module")
def lightning_parser():
    # The parser of a run of the default config, built as `train` builds it (nothing instantiated).
    from minitx.training.command import _CheckOnlyCLI

    return _CheckOnlyCLI(CommandLine.read([], default_config=True)).parser


def test_the_light_parser_has_lightningclis_keys_and_types(lightning_parser):
    theirs, ours = parser_keys(lightning_parser), parser_keys(light_parser())
    # A linked key is a key of config files (a run's saved config.yaml holds them), not of flags.
    assert sorted(set(ours) - set(LINKED)) == sorted(theirs)
    # The trainer's types are Lightning's, left to it; every other key is typed as LightningCLI types it.
    different = {
        key: (ours[key], theirs[key])
        for key in theirs
        if not key.startswith("trainer.") and ours[key] != theirs[key] and theirs[key] != Optional[ours[key]]  # noqa: UP045
    }
    assert different == {}
    assert set(trainer_argument_names()) == {k.split(".")[1] for k in theirs if k.startswith("trainer.")}


def lightningcli_says(args: list[str]) -> str | None:
    try:
        checked_config(CommandLine.read(args, default_config=True))
    except UserError as error:
        return str(error)
    return None


def precheck_says(args: list[str]) -> str | None:
    try:
        check_arguments(CommandLine.read(args, default_config=True))
    except UserError as error:
        return str(error)
    return None


def write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_the_precheck_refuses_as_lightningcli_does(tmp_path):
    unknown_in_file = write(tmp_path / "unknown.yaml", "model:\n  n_layerz: 2\n")
    wrong_type_in_file = write(tmp_path / "type.yaml", "data:\n  batch_size: many\n")
    not_yaml = write(tmp_path / "broken.yaml", "model: [1, 2\n")
    not_a_mapping = write(tmp_path / "list.yaml", "- 1\n- 2\n")
    unknown_trainer_key = write(tmp_path / "trainer.yaml", "trainer:\n  max_stepz: 3\n")
    bad = [
        ["--model.n_layer", "zero"],
        ["--model.n_layerz", "3"],
        ["--foo", "1"],
        ["--trainer.max_stepz", "3"],
        ["--trainer.max_step", "3"],  # an abbreviation: refused by both parsers, the full key named
        ["--model.n_lay", "3"],
        ["--run.nmae", "x"],
        ["--model.mlp", "relu"],
        ["--model.attention.n_kv_head", "two"],
        ["--model.betas", "0.9"],
        ["--data.block_size", "64"],  # linked from model.block_size: not a flag of its own
        ["--model.vocab_size", "64"],
        ["--model.max_steps=64"],
        ["--run.keep_steps+", "x"],
        ["--seed_everything", "abc"],
        ["--config", str(tmp_path / "missing.yaml")],
        ["--config", unknown_in_file],
        ["--config", wrong_type_in_file],
        ["--config", not_yaml],
        ["--config", not_a_mapping],
        ["--config", unknown_trainer_key],
        ["--trainer.callbacks+=json.JSONDecoder"],  # outside the modules a config may import
    ]
    for args in bad:
        expected = lightningcli_says(args)
        assert expected is not None, args
        assert precheck_says(args) == expected, args


@pytest.mark.slow  # 9-24 s of real runs: the fast suite within its minutes (issue 62)
def test_the_precheck_refuses_bad_values_as_lightningcli_does(tmp_path):
    # Values of the right type that the settings' own checks refuse: ModelConfig's and the kinds',
    # Optimisation's, DataConfig's (a task's included), the run section's and the seed's.
    bad_in_file = write(tmp_path / "values.yaml", "model:\n  n_layer: 0\ndata:\n  batch_size: 0\n")
    saved_token = write(tmp_path / "token.yaml", "model:\n  vocab_size: 65\n  document_token: 100\n")
    huge = write(tmp_path / "huge.yaml", f"model:\n  n_layer: {10**20}\n")  # the memory bound, at once
    gqa, local = str(ROOT / "configs" / "gqa.yaml"), str(ROOT / "configs" / "local.yaml")
    bad = [
        ["--model.n_layer", "0"],
        ["--model.d_model", "130", "--model.n_head", "4"],
        ["--model.d_model", "132", "--model.n_head", "4"],  # an odd head dimension under RoPE
        ["--model.dropout", "1.5"],
        ["--model.mlp_hidden_size", "0"],
        ["--model.attention.kind", "nosuch"],
        ["--model.attention.layers", "[mha, nosuch]"],
        ["--model.attention.n_kv_head", "3"],  # mha reads no n_kv_head
        ["--config", gqa, "--model.attention.n_kv_head", "3"],
        ["--config", local, "--model.attention.options.local.window", "0"],
        ["--model.attention.options.mta.query_kernel", "4"],  # options of a kind no layer uses
        ["--model.attention.kind_modules", "[no_such_module_of_kinds]"],
        ["--model.lr", "-1"],
        ["--model.min_lr", "1"],
        ["--model.betas", "[0.9, 1.5]"],
        ["--model.eps", "0"],
        ["--model.eps", "-1"],
        ["--model.optimizer", "sgd"],
        ["--model.optimizer_options.muon.momentum", "1"],
        ["--model.muon_lr", "0.05"],  # an earlier spelling: refused naming the new key
        ["--model.decay_fraction", "2"],
        ["--data.batch_size", "-1"],
        ["--data.num_workers", "-1"],
        ["--data.source", "nosuch"],
        ["--data.sourc", "toy"],  # a prefix of a key is refused, not taken for the key
        ["--data.source", "mqar", "--data.task.mqar.pairs", "0"],
        ["--seed_everything", "-1"],
        ["--run.name", "../x"],
        ["--run.sample_temperature", "-1"],
        ["--config", bad_in_file],  # two mistakes: the first LightningCLI's checks meet
        ["--config", saved_token],  # a run's config holds the linked keys: its token is checked
        ["--config", huge],
    ]
    for args in bad:
        expected = lightningcli_says(args)
        assert expected is not None, args
        assert precheck_says(args) == expected, args


def test_the_precheck_passes_what_lightningcli_accepts(tmp_path):
    logger = write(
        tmp_path / "logger.yaml",
        "trainer:\n  logger:\n    class_path: lightning.pytorch.loggers.CSVLogger\n"
        "    init_args: {save_dir: somewhere}\n",
    )
    saved = write(
        tmp_path / "saved.yaml",
        "model:\n  vocab_size: 65\n  max_steps: 5\n  document_token: null\ndata:\n  block_size: 256\n",
    )
    data_block = write(tmp_path / "block.yaml", "data:\n  block_size: 0\n")
    saved_token = write(tmp_path / "token.yaml", "model:\n  vocab_size: 50257\n  document_token: 50256\n")
    good = [
        [],
        ["--config", str(ROOT / "configs" / "mta.yaml"), "--model.attention.options.mta.query_kernel", "4"],
        ["--config", str(ROOT / "configs" / "gqa.yaml"), "--config", str(ROOT / "configs" / "local.yaml")],
        ["--config", str(ROOT / "examples" / "custom_attention.yaml")],
        [
            "--model.d_model",
            "192",
            "--model.attention.layers",
            "[local, mta]",
            "--model.attention.layers+",
            "mha",
        ],
        ["--trainer.max_steps", "7", "--trainer.precision=bf16-mixed", "--run.keep_steps", "[2, 4]"],
        ["--trainer.callbacks+=minitx.ablation.summary.RunSummary", "--trainer.max_steps", "3"],
        [
            "--trainer.logger.class_path",
            "lightning.pytorch.loggers.CSVLogger",
            "--trainer.logger.init_args.save_dir=logs",
        ],
        ["--config", logger],
        ["--config", saved],  # a run's config.yaml holds the linked keys
        ["--print_config"],
        ["--print_config=skip_null", "--model.n_layer", "2"],
        ["--seed_everything", "true", "--ckpt_path", "last"],
        ["--data.train_files", "[a.txt, b.txt]", "--data.source", "files"],
        # Values at the edge of what the checks allow.
        ["--model.dropout", "0.5", "--model.lr", "1e-2", "--model.min_lr", "1e-2", "--data.num_workers", "0"],
        ["--config", str(ROOT / "configs" / "gqa.yaml"), "--model.attention.n_kv_head", "1"],
        ["--config", data_block],  # the data's block_size is the model's (linked), whatever the file says
        ["--config", saved_token],  # the run's own vocabulary, not the default's, bounds its token
        ["--print_config", "--model.n_layer", "0"],  # printed: LightningCLI checks no value then
    ]
    for args in good:
        assert precheck_says(args) is None, args
        if not any(arg.startswith("--print_config") for arg in args):  # it would print and exit
            assert lightningcli_says(args) is None, args  # the list holds only good lines


def test_to_judge_leaves_out_what_only_lightning_judges():
    names = trainer_argument_names()
    args = [
        "--trainer.callbacks+",
        "x.Y",
        "--model.n_layer",
        "2",
        "--print_config",
        "--trainer.logger.init_args.a=1",
    ]
    assert to_judge(args, names) == ["--model.n_layer", "2"]
    assert to_judge(["--trainer.nonsense.x", "1"], names) == ["--trainer.nonsense.x", "1"]  # refused, then


def test_help_lists_every_key():
    text = help_text()
    for key in set(parser_keys(light_parser())) - set(LINKED):
        assert f"--{key}" in text, key
    assert "--help-trainer" in text
    assert yaml.safe_load(DEFAULT_CONFIG.read_text())  # the defaults it points at exist


def test_help_trainer_is_lightningclis_help():
    from minitx.cli import train_main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        train_main(["--help-trainer"])
    assert "--trainer.accelerator.help" in out.getvalue()  # only LightningCLI lists these


def test_a_did_you_mean_names_a_key_a_flag_may_set():
    """`--max_steps 200` is near model.max_steps and trainer.max_steps; model.max_steps is filled in
    from trainer.max_steps and refused as a flag, so the advice must be trainer.max_steps, and the
    same for every key the command fills in (LINKED): following the advice is never refused again."""
    for key in LINKED:
        leaf = key.split(".")[-1]
        for says in (precheck_says, lightningcli_says):
            message = says([f"--{leaf}", "1"])
            assert message.startswith(f"unrecognized arguments: --{leaf} 1"), message
            suggested = message.partition("did you mean '")[2].partition("'")[0]
            assert suggested not in LINKED, (leaf, message)
    assert precheck_says(["--max_steps", "200"]).endswith("did you mean 'trainer.max_steps'?")
    assert precheck_says(["--trainer.max_steps", "200"]) is None


def test_options_of_a_kind_no_layer_uses_are_refused_whenever_given(tmp_path):
    """At its default too (conv_size 4 is gdn's): a section a user wrote changes nothing when no
    layer is of its kind. Sections a mix of kinds uses, and the defaults a parse fills in for the
    kind of an earlier file, pass."""
    local = str(ROOT / "configs" / "local.yaml")
    refused = "model.attention.options.gdn: sets options of kind gdn, but the layers are of kind local"
    gdn_in_file = write(
        tmp_path / "gdn.yaml", "model:\n  attention:\n    options:\n      gdn: {conv_size: 4}\n"
    )
    for args in (
        ["--config", local, "--model.attention.options.gdn.conv_size", "4"],
        ["--config", local, "--model.attention.options.gdn.conv_size", "8"],
        ["--config", local, "--model.attention.options", "{gdn: {conv_size: 4}}"],
        ["--config", local, "--config", gdn_in_file],
    ):
        for says in (precheck_says, lightningcli_says):
            assert says(args).startswith(refused), (args, says(args))
    for args in (
        ["--config", str(ROOT / "configs" / "hybrid.yaml")],  # gdn and mha options, both used
        [
            "--config",
            local,
            "--model.attention.layers",
            "[local, gdn]",
            "--model.attention.options.gdn.conv_size",
            "4",
        ],
        ["--model.attention.kind", "mqa"],  # default.yaml's mha, its options filled in by the parse
        ["--config", local, "--model.attention.options.gdn", "{}"],  # no option given
    ):
        for says in (precheck_says, lightningcli_says):
            assert says(args) is None, (args, says(args))


KNOWN = ROOT / "configs" / "known_answers"
KNOWN_ANSWER_RUNS = [  # the command lines the configs' headers and the known answers page give
    ["markov.yaml"],
    ["induction.yaml"],
    ["induction.yaml", "induction_24.yaml"],
    ["induction.yaml", "induction_paper.yaml"],
    ["induction.yaml", "induction_paper.yaml", "induction_escape.yaml"],
    ["zoology.yaml"],
    ["zoology.yaml", "zoology_64_4.yaml"],
    ["zoology.yaml", "zoology_256_16.yaml"],
    ["zoology.yaml", "zoology_256_16.yaml", "zoology_deltanet.yaml"],
    ["zoology.yaml", "zoology_256_16.yaml", "zoology_gdn.yaml"],
    ["zoology.yaml", "zoology_window.yaml"],
]


@pytest.mark.parametrize("files", KNOWN_ANSWER_RUNS, ids="+".join)
def test_every_known_answer_run_is_a_valid_run(files):
    args = [arg for name in files for arg in ("--config", str(KNOWN / name))]
    config = checked_config(
        CommandLine.read(args, default_config=True)
    )  # LightningCLI's parse: a UserError if refused
    model, data = config["model"], config["data"]
    if "zoology.yaml" in files:  # Zoology's recipe: dropout on embeddings and weights, none on the stream
        assert (model["dropout"], model["resid_dropout"]) == (0.1, 0.0)
        assert model["block_size"] == data["task"]["zoology"]["seq_len"]


def test_every_known_answer_config_is_run_by_some_command():
    used = {name for files in KNOWN_ANSWER_RUNS for name in files} | {"zoology_kinds.yaml"}
    assert {path.name for path in KNOWN.glob("*.yaml")} == used


def test_the_zoology_kinds_sweep_plans_a_valid_run_per_kind(tmp_path):
    from minitx.ablation import load_sweep, plan_runs

    sweep = load_sweep(KNOWN / "zoology_kinds.yaml")
    runs = plan_runs(sweep, tmp_path, sweep.seeds)
    assert [run.variant.name for run in runs] == ["mha", "qknorm", "sinks", "gated", "diff", "mla"]
    for run in runs:  # each arm's command line, on the base file as the sweep snapshots it
        args = run.command[run.command.index("--config") :]
        args[1] = str(KNOWN / "zoology.yaml")
        args = [a for a in args if not a.startswith("--trainer.callbacks+=")]
        assert lightningcli_says(args) is None, run.variant.name
