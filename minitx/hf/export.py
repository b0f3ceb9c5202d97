"""A minitx checkpoint -> a transformers model directory.

    DIR/config.json               the architecture (native class, or MinitxForCausalLM + auto_map)
    DIR/model.safetensors         the weights, in float32 or bfloat16
    DIR/tokenizer.json            the tokenizer (a char tokenizer becomes a one-char-per-token
    DIR/tokenizer_config.json     word-level model), so AutoTokenizer round-trips text
    DIR/generation_config.json
    DIR/modeling_minitx.py        custom code, only for models no native class expresses

The directory is built beside DIR under a temporary name and renamed into place at the end, so a
failure leaves nothing behind and an existing DIR is replaced only when all of it is written.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from ..config import DROPOUT_FIELDS
from ..errors import UserError
from ..trained_model import UntrustedKindError, load_checkpoint
from . import convert, native, require, require_installed

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MODELING_FILE = Path(__file__).with_name("modeling_minitx.py")
AUTO_MAP = {
    "AutoConfig": "modeling_minitx.MinitxConfig",
    "AutoModelForCausalLM": "modeling_minitx.MinitxForCausalLM",
}


def export_checkpoint(
    ckpt: str, out: str, dtype: str = "float32", force: bool = False, log: Callable[[str], None] = print
) -> str:
    """Write the transformers directory `out` for checkpoint `ckpt`; returns the class name."""
    if dtype not in DTYPES:
        raise UserError(f"--dtype: {dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    check_output_dir(out, force, ckpt)
    require_installed("transformers", "safetensors")  # imported where used, after the checkpoint's checks
    try:
        model, tokenizer, _ = load_checkpoint(ckpt, label="--ckpt")
    except UntrustedKindError as error:
        # No kind from outside minitx can be exported, so its modules are never imported here.
        raise UserError(not_exportable(ckpt, error.kinds)) from None
    if outside := sorted(set(model.config.layer_kinds) - convert.EXPORTABLE_KINDS):
        raise UserError(not_exportable(ckpt, outside))
    architecture, why = native.native_class(model.config)
    if architecture is None and set(model.config.layer_kinds) & convert.NATIVE_ONLY_KINDS:
        raise UserError(f"--ckpt {ckpt}: cannot be exported: {why}")
    hf_model = native_model(model, architecture) if architecture else custom_model(model)
    hf_model.to(DTYPES[dtype])
    target = Path(out).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        save_model(hf_model, tokenizer, staging, custom=architecture is None)
        if target.exists():
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    name = architecture or "MinitxForCausalLM (custom code: load with trust_remote_code=True)"
    log(f"exported {ckpt} -> {out}: {name}, {dtype}; {why}")
    if model.config.document_token is not None:
        # The weights are the same; only inputs that hold several documents are computed otherwise.
        log(
            f"note: the model keeps attention inside documents (document_token {model.config.document_token}); "
            "transformers attends across them: give it one document per sequence"
        )
    return architecture or "MinitxForCausalLM"


def not_exportable(ckpt: str, kinds: list[str]) -> str:
    return (
        f"--ckpt {ckpt}: uses attention kind {', '.join(kinds)}, defined outside minitx, which neither "
        "transformers nor minitx's exported code knows; export works for "
        + ", ".join(sorted(convert.EXPORTABLE_KINDS))
    )


def check_output_dir(out: str, force: bool, ckpt: str) -> None:
    path = Path(out).resolve()
    for inside, what in ((Path(ckpt).resolve(), "--ckpt"), (Path.cwd(), "the current directory")):
        if path == inside or path in inside.parents:  # --force would delete it
            raise UserError(f"--out: {out} contains {what}; give a directory of its own")
    if path.exists() and not path.is_dir():
        raise UserError(f"--out: {out} is a file; give a directory")
    if path.is_dir() and any(path.iterdir()) and not force:
        raise UserError(f"--out: {out} is not empty; pick another directory or add --force to replace it")


def native_model(model, architecture: str):
    """The transformers model of `architecture` holding the minitx model's weights."""
    transformers = require("transformers")
    family = native.family_of(model.config)
    config = transformers.AutoConfig.for_model(**family.native_config(model.config, architecture))
    hf_model = getattr(transformers, architecture)(config)
    weights = family.to_hf_weights(model.state_dict(), model.config)
    hf_model.load_state_dict(convert.complete_biases(weights, hf_model.state_dict()), strict=True)
    return hf_model.eval()


def custom_model(model):
    """MinitxForCausalLM (this package's modeling_minitx.py) holding the minitx model's weights."""
    from .modeling_minitx import MinitxConfig, MinitxForCausalLM

    # dropout: inference only; document_token: not in the exported code (see export_checkpoint's note)
    left_out = {*DROPOUT_FIELDS, "document_token", "mlp_hidden_size"}
    fields = {name: value for name, value in model.config.to_dict().items() if name not in left_out}
    config = MinitxConfig(**fields, mlp_hidden=model.config.mlp_hidden)
    config.auto_map = AUTO_MAP
    hf_model = MinitxForCausalLM(config)
    hf_model.load_state_dict(model.state_dict(), strict=True)
    return hf_model.eval()


def save_model(hf_model, tokenizer, directory: Path, custom: bool) -> None:
    transformers = require("transformers")
    eos = tokenizer.eos_id
    hf_model.generation_config = transformers.GenerationConfig(
        eos_token_id=eos,
        pad_token_id=eos,
        do_sample=False,
        use_cache=getattr(hf_model.config, "use_cache", True),
    )
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        hf_model.save_pretrained(directory)
        hf_tokenizer(tokenizer).save_pretrained(directory)
    finally:
        transformers.logging.set_verbosity(level)
        transformers.utils.logging.enable_progress_bar()
    if custom:
        shutil.copyfile(MODELING_FILE, directory / MODELING_FILE.name)


def hf_tokenizer(tokenizer):
    """A transformers fast tokenizer with the same ids as the minitx tokenizer."""
    transformers = require("transformers")
    from tokenizers import Tokenizer

    saved = tokenizer.to_dict()
    raw = (
        Tokenizer.from_str(saved["json"]) if saved["kind"] == "tokenizers" else char_tokenizer(saved["chars"])
    )
    eos = raw.id_to_token(tokenizer.eos_id) if tokenizer.eos_id is not None else None
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token=eos, clean_up_tokenization_spaces=False
    )


def char_tokenizer(chars: str):
    """One token per character, ids in the order of `chars` (minitx's char tokenizer)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    raw = Tokenizer(models.WordLevel({ch: i for i, ch in enumerate(chars)}, unk_token=None))
    raw.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    raw.decoder = decoders.Fuse()
    return raw
