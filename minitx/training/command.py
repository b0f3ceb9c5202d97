"""The `train` command: YAML + flags -> LightningCLI (jsonargparse) -> MinitxLM + TextDataModule + Trainer.

    python train.py                                   # configs/default.yaml
    python train.py --config configs/gqa.yaml --model.attention.n_kv_head 2 --trainer.max_steps 500
    python train.py --config configs/gqa.yaml --ckpt_path last      # resume runs/<name>/checkpoints/last.ckpt
    python train.py --config configs/default.yaml --print_config    # the resolved configuration

Every field of the model, data, optimiser and trainer is a config key and a dotted flag; the model's
vocab_size comes from the data's tokenizer and data.block_size from model.block_size.

Order of work in `main`: parse; check every input (`check_run`: trainer settings, the run
directory, the checkpoint to resume); only then write anything (`start_run`), fit, and report.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import warnings
from collections.abc import Sequence
from dataclasses import asdict, is_dataclass
from typing import Any, Optional

import lightning as L
import torch
import yaml
from jsonargparse import ArgumentError
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.strategies import StrategyRegistry

from ..config import ModelConfig, used_kinds
from ..data.datamodule import TextDataModule
from ..decoding.loop import generate
from ..errors import UserError, one_line
from ..files.configs import CommandLine
from ..files.runlock import RunLock
from ..hf.load import check_init_from, init_model, run_model_fields
from ..model import Transformer
from .classpaths import check_command_line
from .init_from import check_section, init_from_checkpoint, is_checkpoint_source
from .inputs import check_config
from .interrupt import RunInterrupted, StopOnInterrupt
from .messages import LINKED, LINKED_AT_PARSE, find_user_error, parse_error_message
from .module import MinitxLM
from .resume import check_resume_checkpoint, dict_diff, report_resume_changes, resolve_ckpt_path
from .run import RunCheckpoints, trainer_arguments
from .runsection import RunSettings, settle_run_section
from .sharding import whole_model
from .throughput import device_name, peak_source


class TrainCLI(LightningCLI):
    """LightningCLI without subcommands: parse, build, and let `main` call fit."""

    def __init__(self, args: Sequence[str] | CommandLine):
        # Read once (files/configs.py): bases first, attention options merged option by option.
        self.line = args if isinstance(args, CommandLine) else CommandLine.read(args)
        if not self.line.checked:  # the precheck's checks include this one
            check_command_line(self.line)  # before jsonargparse imports what a class_path names
        super().__init__(
            MinitxLM,
            TextDataModule,
            args=list(self.line.args),
            run=False,
            save_config_callback=None,  # main() writes <run dir>/config.yaml itself
            seed_everything_default=1337,
            auto_configure_optimizers=False,  # MinitxLM.configure_optimizers owns the optimiser
            # allow_abbrev=False: a key is taken only in full (`--trainer.max_step` is refused
            # with trainer.max_steps named), not expanded to whichever key it begins.
            parser_kwargs={
                "exit_on_error": False,
                "allow_abbrev": False,
                "description": "Train a minitx language model.",
            },
            trainer_defaults={
                # The training loader never ends: validation is scheduled in steps, runs in max_steps.
                "check_val_every_n_epoch": None,
                "val_check_interval": 250,
                "max_steps": 5000,
                "log_every_n_steps": 10,
                # main() logs the whole resolved config, one record of the run, instead of
                # Lightning's merge of the module's and the data module's arguments.
                "enable_autolog_hparams": False,
            },
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_class_arguments(RunSettings, "run")
        for flag, text in {
            "--base": "In a config file: the file it overlays, read before it (see minitx/files/configs.py).",
            "--ckpt_path": "Resume from this checkpoint: a path, or 'last' / 'best' in <run.root>/<run.name>/checkpoints/.",
        }.items():
            # Optional[str]: the typing form jsonargparse reads.
            parser.add_argument(flag, type=Optional[str], default=None, help=text)  # noqa: UP045
        # data.block_size from model.block_size, model.max_steps from trainer.max_steps: the
        # precheck applies the same table, as this parse does, before the checks.
        for key in LINKED_AT_PARSE:
            parser.link_arguments(LINKED[key], key)
        # The tokenizer's size, known once the data is built; a model imported with init_from keeps its own.
        parser.link_arguments(
            "data.vocab_size", "model.vocab_size", compute_fn=self._model_vocab, apply_on="instantiate"
        )
        # data.documents: attention stays inside documents, which start with the tokenizer's end-of-text.
        parser.link_arguments("data.document_token", "model.document_token", apply_on="instantiate")

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as err:  # exit_on_error=False: jsonargparse raises instead of exiting
            raise UserError(parse_error_message(err, parser, self.line.files)) from None
        # Before the seed is set or anything is built (the data module reads and tokenises its
        # text). The settings' checks, here unless the precheck made them on this command line,
        # import the config's own kinds first (a resumed run's names them again).
        check_config(self.config, self.line)
        check_strategy(self.config["trainer"].get("strategy"))
        self._imported_vocab: int | None = None
        init_from = self.config["model"].get("init_from")
        if init_from and is_checkpoint_source(init_from):  # a minitx run's: the shapes must agree
            check_section(self.config["model"], init_from)
        elif init_from:  # checked now; imported weights need their own tokenizer, and give the shape
            self.config["data"]["tokenizer"] = check_init_from(init_from)
            self._take_imported_shape(init_from)

    def _take_imported_shape(self, init_from: str) -> None:
        """The model section with the shape of the model in init_from (minitx/hf/load.py), before the
        model is built: the LightningModule gets the fields it builds, and knows nothing of imports."""
        section = self.config["model"]
        fields = {name: section[name] for name in ModelConfig.__dataclass_fields__ if name in section}
        fields.pop("vocab_size", None)  # linked from the data at instantiation: see _model_vocab
        for name, value in run_model_fields(init_from, fields).items():
            section[name] = asdict(value) if is_dataclass(value) else value
        self._imported_vocab = section["vocab_size"]

    def _model_vocab(self, tokens: int) -> int:
        if self._imported_vocab is None:
            return tokens
        if tokens > self._imported_vocab:
            raise UserError(
                f"data.tokenizer: has {tokens} tokens but the model in {self.config['model']['init_from']} only "
                f"{self._imported_vocab}; use its tokenizer.json"
            )
        return self._imported_vocab

    def before_instantiate_classes(self) -> None:
        # The parsed config, before anything is built: the place for checks across sections.
        settle_run_section(
            self.config["run"],
            self.line,
            self.config["trainer"]["default_root_dir"],
            self.config["model"]["attention"],
        )

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except (ValueError, TypeError) as err:  # UserError is a ValueError
            # jsonargparse may wrap what a constructor raised; find a UserError inside if there is one.
            inner = find_user_error(err)
            if inner is None:
                raise UserError(one_line(err)) from None
            if str(inner).startswith("attention"):
                # jsonargparse built model.attention (an AttentionConfig) itself: name the config key.
                raise UserError(f"model.{inner}") from None
            raise inner from None
        init_from = self.config["model"].get("init_from")
        if init_from and is_checkpoint_source(init_from):
            init_from_checkpoint(self.model.model, init_from, self.datamodule.tokenizer.to_dict())
        elif init_from:
            init_model(self.model.model, init_from)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list) -> L.Trainer:
        # The run section as built: jsonargparse instantiates the `run` group, a RunSettings.
        config = trainer_arguments(self.config_init["run"], config)
        try:
            return super()._instantiate_trainer(config, callbacks)
        except UserError:
            raise
        except (MisconfigurationException, ValueError) as err:
            raise UserError(f"trainer: {one_line(err)}") from None


def check_strategy(strategy: Any) -> None:
    """A strategy named by a string must be one Lightning knows (minitx adds fsdp2)."""
    if isinstance(strategy, str) and strategy != "auto" and strategy not in StrategyRegistry:
        raise UserError(
            f"trainer.strategy: is {strategy!r}; use ddp (a copy of the model per device) or fsdp2 (the "
            "model sharded over the devices), see docs/training.md, or another of Lightning's strategies"
        )


class _CheckOnlyCLI(TrainCLI):
    """Parses a train command line exactly as `train` does and makes the checks of its parse
    (check_config: the model, optimiser, data and run settings), but builds nothing: no data is
    read, no network allocated, no seed set."""

    def _set_seed(self) -> None:
        pass

    def instantiate_classes(self) -> None:
        pass


def checked_config(args: Sequence[str] | CommandLine) -> dict[str, Any]:
    """The whole config `train` would run with (every section as plain data), after every check
    `train` makes of it (unknown key, wrong type, bad model, optimiser, data or run value), in a
    second or two: `ablate` checks every variant this way before any run starts. Nothing is built,
    read (the text, checkpoints) or written."""
    _quiet_lightning()
    return _CheckOnlyCLI(args).config.as_dict()


# Known noise from Lightning that says nothing about a minitx run.
_QUIET_WARNINGS = (
    r".*LightningCLI.s args parameter is intended.*",  # main() always passes args explicitly
    r".*does not have many workers.*",  # our loader slices a memmap: workers rarely help
    r".*`isinstance\(treespec, LeafSpec\)` is deprecated.*",
)


class _DropLightningTips(logging.Filter):
    """Lightning 2.6 advertises cloud products at every start; that is not about this run."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("\N{ELECTRIC LIGHT BULB} Tip")


def _quiet_lightning() -> None:
    for pattern in _QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    for handler in logging.getLogger("lightning.pytorch").handlers:
        if not any(isinstance(f, _DropLightningTips) for f in handler.filters):
            handler.addFilter(_DropLightningTips())


def resolved_config(cli: TrainCLI) -> dict:
    """The whole parsed config as plain data; complete, so it names no base file."""
    config = yaml.safe_load(cli.parser.dump(cli.config, skip_validation=True))
    config.pop("base", None)
    # A flag that changes the kind (--model.attention.kind mla over a config of mha) leaves the
    # old kind's options as the parse filled them in; written out, they would be refused when
    # the saved config starts the run again. Only the options of the kinds the layers use stay.
    attention = config["model"]["attention"]
    used = used_kinds(attention["kind"], attention.get("layers"))
    attention["options"] = {k: v for k, v in (attention.get("options") or {}).items() if k in used}
    return config


def check_run(cli: TrainCLI, run: RunSettings) -> str | None:
    """Every check of the built run before it writes anything; returns the checkpoint to resume from."""
    ckpt_path = resolve_ckpt_path(cli.config["ckpt_path"], run.checkpoint_dir)
    if ckpt_path is None and any(run.checkpoint_dir.glob("*.ckpt")):
        raise UserError(occupied_run_message(run, resolved_config(cli)))
    if ckpt_path is not None:
        saved = check_resume_checkpoint(
            ckpt_path, cli.model.config, cli.model.state_dict(), cli.datamodule.tokenizer
        )
        keep_saved_optimizer(cli, ckpt_path, saved)
    return ckpt_path


def occupied_run_message(run: RunSettings, config: dict) -> str:
    """Why a new run may not start in `run.dir`, which holds one: another model or data is
    given its own --run.name first (resuming would be refused), the same settings are offered
    the resume first."""
    try:
        saved = yaml.safe_load((run.dir / "config.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        saved = {}

    def section(config: dict, name: str) -> dict:  # a longer max_steps is what resuming is for
        return {**(config.get(name) or {}), "max_steps": None}

    diffs = (dict_diff(section(saved, name), section(config, name), f"{name}.") for name in ("model", "data"))
    different = next((d for d in diffs if d), "")
    if different:  # dict_diff speaks of a checkpoint and a config: here, of that run and this one
        different = different.replace(": checkpoint ", ": that run ", 1)
        different = different.replace(", config ", ", this one ", 1)
        return (
            f"run.name: {str(run.dir)!r} holds a run with other settings ({different}); give this run its own "
            f"directory with --run.name NAME (e.g. --run.name {run.name}-2), or delete that directory"
        )
    return (
        f"run.name: {str(run.dir)!r} already holds a run; resume it with --ckpt_path last, "
        "choose another --run.name, or delete that directory"
    )


def keep_saved_optimizer(cli: TrainCLI, ckpt_path: str, saved: str) -> None:
    """A run resumes with the optimiser its checkpoint holds the state of (AdamW's moments are not
    Muon's momentum), whatever the config says: a run of an older minitx, or one begun before
    configs/default.yaml chose Muon, continues with AdamW. Said in one line when they differ."""
    configured = cli.model.optimisation.optimizer
    if saved == configured:
        return
    print(
        f"minitx: {ckpt_path} was trained with model.optimizer {saved}, not {configured}; the run "
        f"continues with {saved} (start a new run to train with {configured})",
        file=sys.stderr,
    )
    cli.model.optimisation = dataclasses.replace(cli.model.optimisation, optimizer=saved)  # fit reads it
    cli.model.hparams["optimizer"] = saved  # what the checkpoints it writes say
    cli.config["model"]["optimizer"] = saved  # the run's saved config says what it trains with


def start_run(cli: TrainCLI, run: RunSettings, ckpt_path: str | None) -> None:
    """What a run writes before fit: the resolved config (run directory and loggers), and what
    its checkpoints carry besides the weights."""
    model, data, trainer = cli.model, cli.datamodule, cli.trainer
    config_dump = resolved_config(cli)
    config_dump["ckpt_path"] = None  # the saved config starts a run; resuming is a flag
    model.train_config = config_dump
    model.tokenizer_dict = data.tokenizer.to_dict()
    for logger in trainer.loggers:
        logger.log_hyperparams(config_dump)
    if trainer.is_global_zero:
        run.dir.mkdir(parents=True, exist_ok=True)
        (run.dir / "config.yaml").write_text(yaml.safe_dump(config_dump, sort_keys=False))
        print(
            f"minitx: {model.model.num_params() / 1e6:.2f}M parameters, layers {model.config.layer_kinds}; data: {data.summary()}"
        )
        print(f"minitx: run directory {run.dir}" + (f", resuming from {ckpt_path}" if ckpt_path else ""))
        # Said, not refused: a few steps to see that training starts are a run too.
        if warmup := model.optimisation.all_warmup(trainer.max_steps):
            print(f"minitx: warning: {warmup}", file=sys.stderr)
        device = trainer.strategy.root_device
        source = peak_source(device)
        if source is None:
            print(f"minitx: MFU unknown (no peak FLOP/s known for {device_name(device)})")
        elif source.startswith("measured"):  # no datasheet figure: said, since it is this machine's
            print(f"minitx: MFU against the {source} peak of this {device_name(device)}, no datasheet figure")


def main(line: CommandLine) -> None:
    """The `train` command past its precheck (precheck.py, which reads the command line): parse
    the config, fit, print the final val loss and a sample."""
    _quiet_lightning()
    if torch.cuda.is_available():
        torch.set_float32_matmul_precision("high")  # TF32 for the fp32 matmuls that remain
    cli = TrainCLI(line)
    model, data, trainer = cli.model, cli.datamodule, cli.trainer
    run: RunSettings = cli.config_init["run"]  # the `run` group, instantiated by jsonargparse
    RunLock(run.dir).refuse_if_held()  # a directory another process trains into is named as busy
    ckpt_path = check_run(cli, run)
    if ckpt_path is not None:
        report_resume_changes(ckpt_path, resolved_config(cli))
    sample_prompt = prompt_ids(
        run.sample_prompt, data.tokenizer, run.sample_prompt == RunSettings.sample_prompt
    )
    # Every check of the input is done: only now does the run write anything, holding its
    # directory's lock (another process training into it is refused) until the end.
    stop = StopOnInterrupt()
    trainer.callbacks.append(stop)
    with RunLock(run.dir), stop.installed():
        if ckpt_path is None:
            check_run(cli, run)  # again, now that no other process can start a run there
        start_run(cli, run, ckpt_path)
        trainer.fit(model, datamodule=data, ckpt_path=ckpt_path, weights_only=True)
        if stop.requested:
            raise RunInterrupted(stop.message(trainer, run.checkpoint_dir))
        finish_run(cli, run, sample_prompt)


def finish_run(cli: TrainCLI, run: RunSettings, sample_prompt: list[int]) -> None:
    """After fit: the final val loss (validated now if the last step was not) and a sample."""
    model, data, trainer = cli.model, cli.datamodule, cli.trainer
    if model.last_val is None or model.last_val[0] != trainer.global_step:
        trainer.validate(model, datamodule=data, verbose=False)
        model.last_val = (trainer.global_step, float(trainer.callback_metrics["val_loss"]))
        # Only when fit ran no step (a resume of a finished run): the final step is otherwise
        # validated inside fit. best.ckpt must still exist and hold the lowest val loss.
        if isinstance(trainer.checkpoint_callback, RunCheckpoints):
            trainer.checkpoint_callback.validated_after_fit(trainer, model.last_val[1])
    # Under fsdp2 every rank takes part in gathering the weights; rank 0 samples from them.
    whole = whole_model(model) if run.sample_tokens > 0 else None
    if trainer.is_global_zero:
        step, val_loss = model.last_val
        print(
            f"final val loss {val_loss:.4f} (perplexity {math.exp(val_loss):.2f}) at step {step}; checkpoints in {run.checkpoint_dir}"
        )
        if run.sample_tokens > 0:
            text = sample_text(
                whole, data.tokenizer, sample_prompt, run.sample_tokens, run.sample_temperature
            )
            print("sample:\n" + text)


# ------------------------------------------------------------------------------------------------
# The sample printed at the end of a run


def prompt_ids(prompt: str, tokenizer: Any, is_default: bool) -> list[int]:
    """The sample's prompt as ids; the default prompt ("\\n") falls back to id 0 in a vocabulary
    without a newline (the toy task), a prompt the user chose must encode."""
    try:
        return tokenizer.encode(prompt) or [0]
    except UserError as err:
        if is_default:
            return [0]
        raise UserError(f"run.sample_prompt: {err}") from None


@torch.no_grad()
def sample_text(
    model: Transformer, tokenizer: Any, ids: list[int], max_new_tokens: int, temperature: float = 0.8
) -> str:
    """A continuation of the prompt `ids` from `model`, decoded (prompt included). As generate.py:
    the sample ends at the tokenizer's end-of-text, which is not shown (nor in the prompt)."""
    eos = getattr(tokenizer, "eos_id", None)
    idx = torch.tensor([ids], dtype=torch.long, device=next(model.parameters()).device)
    out = generate(model, idx, max_new_tokens, temperature=temperature, top_k=200, eos_id=eos)
    new = out[0, len(ids) :].tolist()
    if eos in new:
        new = new[: new.index(eos)]
    return tokenizer.decode([token for token in ids if token != eos] + new)
