"""A trained model from its checkpoint: `load_checkpoint` for generation, evaluation and export.

minitx/files/checkpoint.py reads the file (torch.load with weights_only=True, after checking its
bytes) and knows its layout; this module builds what the file describes: the model config, the
tokenizer and the Transformer with its weights. It sits above the model, so that files/ stays
input and output that the model's own modules may import. It needs no Lightning.

A checkpoint of an attention kind defined outside minitx names the modules that register it
(`model_config.attention.kind_modules`). `load_checkpoint` imports them only with the user's
consent (`trust_kind_modules`, `--trust-kind-modules` on the commands); without it, such a
checkpoint is refused in one line naming them, unless its kinds are registered already; once
imported, such a kind is probed for causality (verify/probe.py) as training probes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import kinds
from .arguments import TRUST_FLAG
from .config import ModelConfig
from .data.tokenizer import tokenizer_from_dict
from .errors import UserError, one_line
from .files.checkpoint import model_weights, read_checkpoint, state_mismatch
from .kinds import KindModuleError
from .model import Transformer
from .verify.probe import find_leak

# How a user consents to importing a checkpoint's kind modules in Python (TRUST_FLAG: on the commands).
TRUST_KEYWORD = "trust_kind_modules=True"


class UntrustedKindError(UserError):
    """A checkpoint's attention kind is not registered, and importing the modules that register
    it (code named by the file) was not consented to. `kinds`: the kinds; `modules`: what the
    checkpoint names in attention.kind_modules."""

    def __init__(self, message: str, kinds: list[str], modules: list[str]):
        super().__init__(message)
        self.kinds, self.modules = kinds, modules


def import_checkpoint_kinds(
    model_config: Any, where: str, trust_kind_modules: bool | Sequence[str] = False
) -> None:
    """Make the kinds of a checkpoint's saved model config available, importing only with consent.

    Kinds registered already (built in, or imported by the user) need nothing, and nothing is
    imported for them. Otherwise the checkpoint's attention.kind_modules are imported when
    `trust_kind_modules` is True, or a list that holds every one of them (the modules a config
    of the user's own names: a sweep's evaluation of its runs); else UntrustedKindError.
    """
    attention = model_config.get("attention") if isinstance(model_config, dict) else None
    if not isinstance(attention, dict):
        return  # ModelConfig.from_dict says what is wrong with it
    missing = kinds.unregistered_kinds(attention)
    modules = attention.get("kind_modules") or []
    if not missing or not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
        return  # nothing to import, or a damaged entry that ModelConfig.from_dict names
    named = ", ".join(missing)
    if not modules:
        raise UserError(
            f"{where}: its attention kind {named} is not registered, and the checkpoint names no module that "
            "registers it (attention.kind_modules); import that module before loading the checkpoint"
        )
    if trust_kind_modules is True:
        untrusted = []
    else:
        trusted = {kinds.module_identity(m) for m in (trust_kind_modules or [])}
        untrusted = [m for m in modules if kinds.module_identity(m) not in trusted]
    if untrusted:
        raise UntrustedKindError(
            f"{where}: its attention kind {named} is defined outside minitx, and loading it would import and run "
            f"{', '.join(untrusted)} (attention.kind_modules); if you trust that code, load with {TRUST_FLAG} "
            f"(Python: {TRUST_KEYWORD}), or import the module yourself first",
            missing,
            modules,
        )
    try:
        kinds.import_kind_modules(modules)
    except KindModuleError as error:  # a kind of the user's own: its file must be found again
        raise UserError(f"{where}: its attention kind comes from outside minitx: {error}") from None
    still = kinds.unregistered_kinds(attention)
    if still:
        raise UserError(
            f"{where}: attention kind {', '.join(still)} is registered by none of {', '.join(modules)} "
            "(attention.kind_modules); give the module that registers it"
        )


def saved_model_config(
    meta: dict, where: str, trust_kind_modules: bool | Sequence[str] = False
) -> ModelConfig:
    """The ModelConfig of a checkpoint's "minitx" entry, its kinds made available first (with
    consent: import_checkpoint_kinds); a damaged one is a one-line UserError starting with `where`."""
    import_checkpoint_kinds(meta.get("model_config"), where, trust_kind_modules)
    try:
        return ModelConfig.from_dict(meta["model_config"])
    except (KeyError, TypeError, ValueError) as error:
        raise UserError(
            f"{where}: its model config is invalid ({one_line(error, 200)}); the file is damaged or from another version"
        ) from None


def refuse_noncausal_kinds(config: ModelConfig, meta: dict, where: str) -> None:
    """A kind from outside minitx that lets a future token change an earlier output (the probe of
    verify/probe.py) is refused, unless the run was trained with model.allow_noncausal_kinds: a
    kind that passed the probe when it trained has changed since, or the run predates the probe."""
    run_config = meta.get("train_config") or {}
    if (run_config.get("model") or {}).get("allow_noncausal_kinds"):
        return
    leak = find_leak(config)
    if leak is not None:
        raise UserError(
            f"{where}: {leak.words()}, and the run was not trained with --model.allow_noncausal_kinds true; "
            "its losses are not a causal model's: make the kind hide from each query the keys after it, "
            "and train again"
        )


def load_checkpoint(
    path: str,
    map_location="cpu",
    label: str = "checkpoint",
    *,
    trust_kind_modules: bool | Sequence[str] = False,
):
    """(model, tokenizer, raw) from a checkpoint saved by training; the model is in eval mode.

    The file is read by read_checkpoint (torch.load with weights_only=True): "state_dict" holds the
    weights, "minitx" the model config and the tokenizer as plain data. Every problem is a
    UserError starting with `label` and the path. A kind not registered in this process needs
    `trust_kind_modules` (import_checkpoint_kinds), else UntrustedKindError.
    """
    where = f"{label} {path}"
    raw = read_checkpoint(path, where, "give a checkpoint saved by train.py", map_location)
    meta = raw["minitx"]
    config = saved_model_config(meta, where, trust_kind_modules)
    try:
        tokenizer = tokenizer_from_dict(meta["tokenizer"])
    except Exception as error:
        raise UserError(
            f"{where}: its tokenizer cannot be rebuilt ({one_line(error, 200)}); the file is damaged or from another version"
        ) from None
    if tokenizer.vocab_size > config.vocab_size:
        raise UserError(
            f"{where}: tokenizer has {tokenizer.vocab_size} tokens but the model only {config.vocab_size}; the file is damaged"
        )
    refuse_noncausal_kinds(config, meta, where)
    weights = model_weights(raw)
    model = Transformer(config)
    mismatch = state_mismatch(model.state_dict(), weights)
    if mismatch:
        raise UserError(
            f"{where}: its weights do not match its model config ({mismatch}); the file is damaged or was edited"
        )
    model.load_state_dict(weights)
    model.to(map_location).eval()
    return model, tokenizer, raw
