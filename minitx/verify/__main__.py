"""Check an attention kind of your own: `python -m minitx.verify mine.py` (or a module's name).

    python -m minitx.verify examples/custom_attention.py
    python -m minitx.verify mine.py --kind softcap --options cap=30 per_head=false

Imports the file, and for each kind it registers (or the one --kind names) builds a tiny model of
that kind and prints one line per check, ok with what it measured or the one thing wrong:
options (they build, and a checkpoint can hold them), causality (no future token moves an earlier
logit or gradient), reference (the fast path `attend` equals `reference`, where the kind has one),
cached decode (equal to the full forward), generation (with the cache and without), gradient step
(a finite loss, a gradient for every parameter of the kind). Exit status 0 when every check
passes, 1 when one fails, 2 for a mistake in the command line (a missing file, one that registers
no kind). A few seconds on a CPU; kind_check.py holds the checks.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from ..arguments import ArgumentParser
from ..errors import UserError
from ..kinds import (
    KindModuleError,
    KindSpec,
    build_options,
    defining_file,
    import_kind_modules,
    is_built_in,
    kind_file,
    registry,
)
from .kind_check import check_kind


def parse_args(argv: Sequence[str] | None):
    parser = ArgumentParser(
        prog="python -m minitx.verify",
        description="Check an attention kind of your own: causality, cached decoding, the reference path, "
        "generation, a gradient step and its options, one line each.",
    )
    parser.add_argument("module", help="the .py file that registers the kind, or an importable module's name")
    parser.add_argument("--kind", default=None, help="check only this kind (the file registers several)")
    parser.add_argument(
        "--options",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="the kind's options to check with (YAML values: 1.0, true, [2, 3]); default: its defaults",
    )
    return parser.parse_args(argv)


def registered_by(module: str) -> list[KindSpec]:
    """The kinds from outside minitx that `module` (a .py file or a module's name) registers:
    those new in the registry once it is imported, and those whose layer it defines."""
    if module.endswith(".py") and not Path(module).is_file():
        raise UserError(
            f"{module}: no such file; give the .py file that registers your kind, or its module name"
        )
    before = dict(registry)
    try:
        import_kind_modules([module])
    except KindModuleError as error:
        raise UserError(str(error).removeprefix("attention.kind_modules: ")) from None
    path = str(Path(module).resolve()) if module.endswith(".py") else None

    def defines(spec: KindSpec) -> bool:
        if path is not None:
            return defining_file(spec.module) == path
        return spec.module.__module__ == module or spec.module.__module__.startswith(module + ".")

    return [
        spec
        for name, spec in registry.items()
        if not is_built_in(spec) and (before.get(name) is not spec or defines(spec))
    ]


def chosen_kinds(args) -> list[KindSpec]:
    specs = registered_by(args.module)
    if not specs:
        raise UserError(
            f"{args.module}: registers no attention kind; end it with minitx.register(KindSpec(name, layer_class, "
            "options=...)), as examples/custom_attention.py does"
        )
    names = [spec.name for spec in specs]
    if args.kind is not None:
        if args.kind not in names:
            raise UserError(
                f"--kind: {args.module} registers no kind {args.kind!r}; it registers {', '.join(names)}"
            )
        specs = [registry[args.kind]]
    if args.options and len(specs) > 1:
        raise UserError(f"--options: {args.module} registers {', '.join(names)}; name the kind with --kind")
    return specs


def options_from(pairs: list[str]) -> dict:
    """--options KEY=VALUE ...: each value read as YAML (1.0, true, [2, 3], text)."""
    values = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise UserError(f"--options: {pair} is not KEY=VALUE; write e.g. scale_init=0.5")
        try:
            values[key] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise UserError(
                f"--options: {pair}: the value is not YAML; write e.g. 0.5, true or [2, 3]"
            ) from None
    return values


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        specs = chosen_kinds(args)
        options = options_from(args.options)
        for spec in specs:  # the kind's own checks of the values given: a mistake of the command line
            build_options(spec.name, options)
    except UserError as error:
        print(f"verify: error: {error}", file=sys.stderr)
        return 2
    failed = False
    for spec in specs:
        print(f"kind {spec.name} ({kind_file(spec)})")
        for result in check_kind(spec, options):
            print(f"  {result.line()}", flush=True)
            failed |= not result.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
