"""Budgets: what a variant costs (parameters, training FLOPs per token) and `match`, which resizes
each variant's MLP to the reference variant's budget so a comparison is of equal sizes.

Counts for matching leave out the token and position tables and an untied output layer: every
variant shares them (same vocabulary, same width), so they only dilute the difference. The MLP
hidden width is the knob: it holds most of a block's parameters, leaves the attention that is
being compared alone, and the counts are linear in it, so the width is solved for, then checked.
The output layer is counted at the vocabulary the runs train with (training_vocab): their data's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any

import torch
import yaml

from ...config import ModelConfig
from ...data.config import DataConfig
from ...errors import UserError
from ...flops import FLOP_CONVENTION
from ...model import Transformer
from .sweep import Sweep, Variant

TOLERANCE = 0.02  # a matched variant's count is within 2% of the reference's
WIDTH_KEY = "model.mlp_hidden_size"
MEASURES = {"params": "params_non_embedding", "flops": "flops_per_token_non_embedding"}


def model_budget(model: Transformer) -> dict[str, Any]:
    """Parameters (all, and the non-embedding ones: Transformer.non_embedding_params) and training FLOPs per token
    at block_size: Transformer.flops_per_token, 6 per matmul weight plus each layer's attention
    work over the pairs its queries see (minitx/flops.py), so arms of different kinds cost what
    their math needs (a window's pairs, diff's two maps, MTA's convolutions and head mixes, MLA's
    widths), the same on the meta device that plans a sweep as on the device that trains it;
    `flop_convention` names that count in what a run records."""
    flops = model.flops_per_token()
    return {
        "params": model.num_params(positions=True),
        "params_non_embedding": model.non_embedding_params(),
        "flops_per_token": flops,
        "flop_convention": FLOP_CONVENTION,
        # the output layer's matmul (6 FLOPs per weight) is what the vocabulary adds to the FLOPs:
        # the token table is a lookup, which flops_per_token does not count
        "flops_per_token_non_embedding": flops - 6 * model.lm_head.weight.numel(),
        "mlp_hidden": model.config.mlp_hidden,
    }


def budget_of(config: ModelConfig) -> dict[str, Any]:
    """model_budget of a model of this config, built on the meta device: no memory, no time."""
    with torch.device("meta"):
        return model_budget(Transformer(config))


def config_section(name: str, sweep: Sweep, variant: Variant, extra: Sequence[str] = ()) -> dict[str, Any]:
    """A section (`model`, `data`) as a variant's runs train with it: the base's, the shared
    overrides, the variant's, then `--<name>.*` arguments given after --; nested keys
    (model.attention.options.local.window, data.task.zoology.pairs) into nested sections."""
    section = dict((yaml.safe_load(sweep.base_text) or {}).get(name) or {})
    dotted = {**sweep.overrides, **variant.overrides}
    for i, arg in enumerate(extra):
        if arg.startswith(f"--{name}."):
            key, _, value = arg[2:].partition("=")
            dotted[key] = value if "=" in arg else (extra[i + 1] if i + 1 < len(extra) else None)
    for key, value in dotted.items():
        parts = key.split(".")
        if parts[0] != name or len(parts) < 2:
            continue
        inner = section
        for part in parts[1:-1]:
            inner[part] = dict(inner.get(part) or {})
            inner = inner[part]
        inner[parts[-1]] = yaml.safe_load(value) if isinstance(value, str) else value
    return section


def model_section(sweep: Sweep, variant: Variant, extra: Sequence[str] = ()) -> dict[str, Any]:
    """The `model` section a variant's runs train with (config_section's)."""
    section = config_section("model", sweep, variant, extra)
    section["attention"] = dict(section.get("attention") or {})
    return section


def model_config_of(sweep: Sweep, variant: Variant, extra: Sequence[str] = ()) -> ModelConfig:
    known = {f.name for f in fields(ModelConfig)}
    section = {key: value for key, value in model_section(sweep, variant, extra).items() if key in known}
    try:
        return ModelConfig.from_dict(section)
    except (UserError, TypeError) as error:  # UserError names the field: make it the config key
        raise UserError(f"variant {variant.name!r}: model.{error}") from None


# The vocabularies found by training_vocab, by the data settings that decide them: a sweep planned
# again in the same process (a rerun's phases, tests) opens its tokenizer once.
_VOCABULARIES: dict[str, int] = {}


def training_vocab(sweep: Sweep, variant: Variant, extra: Sequence[str] = ()) -> int:
    """The vocabulary a variant's runs train with, to which the train command links
    model.vocab_size: a pure function of their data section (DataConfig.training_tokenizer; a
    text's is prepared now if it is not yet, as the sweep would before its first run). The
    sweep's budgets count the output layer at this size. Refused in one line, naming the data's
    problem, when the data cannot be read."""
    section = config_section("data", sweep, variant, extra)
    decided_by = json.dumps(section, sort_keys=True, default=str)
    if decided_by not in _VOCABULARIES:
        try:
            _VOCABULARIES[decided_by] = DataConfig.from_config(section).training_tokenizer().vocab_size
        except (UserError, TypeError) as error:
            raise UserError(
                f"variant {variant.name!r}: {error} (the budgets count the output layer at the vocabulary "
                "of the data its runs train with, so the data is read before the sweep is planned)"
            ) from None
    return _VOCABULARIES[decided_by]


def _with_width(config: ModelConfig, width: int) -> ModelConfig:
    return ModelConfig.from_dict({**config.to_dict(), "mlp_hidden_size": width})


def solve_width(
    config: ModelConfig, target: float, measure: Callable[[ModelConfig], float]
) -> tuple[int, float]:
    """The MLP width that brings the measure within the tolerance of target, and that measure:
    the width as it is when it already does (no change for its own sake), else the nearest width.
    The measure is linear in the width, so two points give the line; the rounded solution is then
    measured itself."""
    width, here = config.mlp_hidden, measure(config)
    if abs(here - target) <= TOLERANCE * target:
        return width, here
    per_unit = measure(_with_width(config, width + 1)) - here
    best = max(1, round(width + (target - here) / per_unit))
    return best, measure(_with_width(config, best))


def match_budgets(sweep: Sweep, by: str, extra: Sequence[str] = (), log: Any = print) -> None:
    """Give every variant but the reference the MLP width that brings its budget (`by`: params or
    flops) within 2% of the reference's; refuse with one line when no width does."""
    key = MEASURES[by]
    reference = sweep.reference or sweep.variants[0]
    target = budget_of(model_config_of(sweep, reference, extra))[key]
    for variant in sweep.variants:
        if variant is reference or variant.name == reference.name:
            continue
        if WIDTH_KEY in variant.overrides:
            raise UserError(
                f"variant {variant.name!r}: sets {WIDTH_KEY} and 'match: {by}' would change it; remove one"
            )
        config = model_config_of(sweep, variant, extra)
        width, value = solve_width(config, target, lambda c: budget_of(c)[key])
        off = value / target - 1
        if abs(off) > TOLERANCE:
            raise UserError(
                f"variant {variant.name!r}: 'match: {by}' cannot come within 2% of {reference.name}'s {target:,.0f} "
                f"by the MLP width (closest: width {width} gives {value:,.0f}, {off:+.1%}); "
                "resize the variant by hand or remove 'match'"
            )
        figures = f"({by} {value:,.0f}, {off:+.2%} vs {reference.name})"
        if width == config.mlp_hidden:  # already within 2%: nothing to change
            log(f"ablate: match  {variant.name}: MLP width {width} kept {figures}")
            continue
        variant.overrides = {**variant.overrides, WIDTH_KEY: width}
        variant.resized = f"MLP width {config.mlp_hidden} -> {width} {figures}"
        log(f"ablate: match  {variant.name}: {variant.resized}")
