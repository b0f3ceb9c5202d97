"""The registry of attention kinds: what each kind declares about itself, in plain Python.

A `KindSpec` names a kind, its layer class, and its options: a dataclass defined beside the
layer, whose fields are the kind's settings (`attention.options.<kind>.<field>` in a config) and
whose annotations and `__post_init__` are their checks. The registry is the one place that knows
the kinds: config validation, the model, caches and the commands all look kinds up here. The
built-in kinds register from `minitx.attention`; a kind of your own registers the same way from
its own file, which a config names in `attention.kind_modules` (see examples/custom_attention.py)
and `import_kind_modules` imports: train.py and ablate.py for the config they are given, a
checkpoint's loader only with the user's consent (minitx/trained_model.py), a config never.

This file imports nothing heavy, so `config` can validate against it.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import sys
import types
import typing
import zlib
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

from .errors import UserError, shown


def fail(field_name: str, problem: str, fix: str) -> None:
    # UserError is a ValueError: Python callers catch ValueError, the command lines print one line.
    raise UserError(f"{field_name}: {problem}; {fix}")


def check_choice(field_name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        fail(field_name, f"unknown value {value!r}", f"choose one of {', '.join(map(str, choices))}")


def nearest(name: str, names) -> str:
    """' (did you mean X?)' for the closest of names, or '' when none is close."""
    close = difflib.get_close_matches(name, list(names), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def kv_heads_from_config(attention, n_head: int) -> int:
    """Key/value heads of a kind that reads `n_kv_head` (None: as many as query heads)."""
    return attention.n_kv_head or n_head


@dataclass(frozen=True)
class KindSpec:
    """What one attention kind knows about itself.

    name: the value of `attention.kind` / an entry of `attention.layers`.
    module: the layer class (a subclass of minitx.KindLayer, or of minitx.Attention for a softmax
        kind), called as module(model_config, layer_index); it reads its options with
        `config.options_at(layer)`.
    options: the kind's options, a dataclass with a default for every field. Its annotations are
        checked (int, float, bool, str, Literal choices, lists, None), its __post_init__ checks the
        rest and raises OptionError(field, problem, fix); the user sees `attention.options.<kind>.<field>`.
    kv_heads: (attention_config, n_head) -> key/value heads of one layer of this kind; the default
        reads the shared `attention.n_kv_head`.
    reads_n_kv_head: whether `attention.n_kv_head` means something to this kind (else it must be unset).
    reads_rope: whether its layers rotate by positions.rope (gdn's order enters through its recurrence).
    check_model: checks that need the whole ModelConfig (n_layer, n_head, ...) besides the options.
    """

    name: str
    module: type
    options: type | None = None
    kv_heads: Callable[[Any, int], int] = kv_heads_from_config
    reads_n_kv_head: bool = True
    check_model: Callable[[Any], None] | None = None
    reads_rope: bool = True


class KindModuleError(UserError):
    """A module named in attention.kind_modules cannot be imported."""


class OptionError(ValueError):
    """A kind's option is wrong: raised by an options dataclass, named in full by the config."""

    def __init__(self, option: str, problem: str, fix: str):
        super().__init__(option, problem, fix)
        self.option, self.problem, self.fix = option, problem, fix


registry: dict[str, KindSpec] = {}


def register(spec: KindSpec) -> KindSpec:
    """Add a kind (or replace the one of the same name); returns the spec."""
    if spec.options is not None and not is_dataclass(spec.options):
        raise TypeError(f"kind {spec.name}: options must be a dataclass, got {spec.options!r}")
    for f in fields(spec.options) if spec.options is not None else ():
        if f.default is MISSING and f.default_factory is MISSING:
            raise TypeError(f"kind {spec.name}: option {f.name} needs a default")
    registry[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    registry.pop(name, None)


def kinds_reading_n_kv_head() -> list[str]:
    return [name for name, spec in registry.items() if spec.reads_n_kv_head]


def spec_of(field_name: str, kind: str, kind_modules: list[str] | None = None) -> KindSpec:
    if kind not in registry:
        if kind_modules:  # named, but building a config imports nothing: the caller imports them
            fail(
                field_name,
                f"kind {kind!r} is not registered, and attention.kind_modules "
                f"({', '.join(map(str, kind_modules))}) is not imported: a config imports no code",
                "call minitx.import_kind_modules(attention.kind_modules) first (the commands do), "
                f"or choose one of {', '.join(registry)}",
            )
        fail(
            field_name,
            f"unknown kind {kind!r}{nearest(kind, registry)}",
            f"choose one of {', '.join(registry)}, or name the module that registers it in attention.kind_modules",
        )
    return registry[kind]


# -- options: built from plain values, checked by their annotations and their __post_init__ ---------


def build_options(kind: str, given: Any) -> Any:
    """The kind's options object from a dict of the values a user set (the rest take defaults)."""
    spec = registry[kind]
    where = f"attention.options.{kind}"
    if spec.options is None:
        if given:
            fail(where, f"kind {kind} has no options", "remove this section")
        return None
    if isinstance(given, spec.options):
        given = asdict(given)
    if not isinstance(given, dict):
        fail(where, f"is {given!r}, not a mapping of option names to values", "write option: value pairs")
    known = [f.name for f in fields(spec.options)]
    for name in given:
        if name not in known:
            fail(
                f"{where}.{name}",
                f"kind {kind} has no such option{nearest(name, known)}",
                f"its options are {', '.join(known)}",
            )
    hints = typing.get_type_hints(spec.options)
    values = {name: check_type(f"{where}.{name}", value, hints[name]) for name, value in given.items()}
    try:
        return spec.options(**values)
    except OptionError as err:
        fail(f"{where}.{err.option}", err.problem, err.fix)


def check_type(name: str, value: Any, hint: Any) -> Any:
    """value checked against a type annotation: the annotation is the one statement of a choice."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        check_choice(name, value, args)
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        problems = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return check_type(name, value, arg)
            except UserError as err:
                problems.append(str(err))
        raise UserError(problems[0])
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            fail(name, f"is {value!r}, not a list", "write a list, e.g. [0, 1]")
        return (
            [check_type(f"{name}[{i}]", item, args[0]) for i, item in enumerate(value)]
            if args
            else list(value)
        )
    if hint is bool:
        if not isinstance(value, bool):
            fail(name, f"is {value!r}, not true or false", "write true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            fail(name, f"is {value!r}, not a whole number", "write a whole number")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            fail(name, f"is {value!r}, not a number", "write a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            fail(name, f"is {value!r}, not text", "write text")
        return value
    return value  # an annotation this checker does not know: the dataclass checks it itself


# -- kinds defined outside minitx ------------------------------------------------------------------


def is_built_in(spec: KindSpec) -> bool:
    """Whether a kind is minitx's own (its layer class is defined inside the minitx package): the
    built-in kinds are held causal and exact by their tests, a kind from outside by verify/."""
    module = spec.module.__module__
    return module == "minitx" or module.startswith("minitx.")


def defining_file(cls: type) -> str | None:
    """The resolved path of the file that defines `cls` (None for one defined without a file)."""
    path = getattr(sys.modules.get(cls.__module__), "__file__", None)
    return str(Path(path).resolve()) if path else None


def kind_file(spec: KindSpec) -> str:
    """Where a kind's layer is defined, as shown to its user (its module's name if it has no file)."""
    path = defining_file(spec.module)
    return shown(path) if path else spec.module.__module__


def outside_kind_files() -> set[str]:
    """The files (resolved) that define the layers and options of the kinds registered from outside minitx."""
    classes = [c for spec in registry.values() if not is_built_in(spec) for c in (spec.module, spec.options)]
    return {path for path in map(defining_file, filter(None, classes)) if path}


def used_kinds(attention: Any) -> list[str]:
    """The kinds a saved attention section's layers use (`kind`, or the entries of `layers`)."""
    layers = attention.get("layers")
    names = layers if isinstance(layers, list) and layers else [attention.get("kind", "mha")]
    return list(dict.fromkeys(name for name in names if isinstance(name, str)))


def unregistered_kinds(attention: Any) -> list[str]:
    """The kinds of a saved attention section that no module imported so far registers."""
    if not isinstance(attention, dict):
        return []
    return [name for name in used_kinds(attention) if name not in registry]


def module_identity(name: str) -> str:
    """What an entry of kind_modules imports: a .py file by its absolute path, else the module name."""
    return str(Path(name).resolve()) if name.endswith(".py") else name


def import_kind_modules(names: list[str]) -> None:
    """Import each module that registers kinds: a module name (`mypackage.attention`) or a .py file
    (`examples/custom_attention.py`, relative to the working directory). Each is imported once.

    Importing runs the module's code. A config never calls this (building one has no effects):
    the train and ablate commands call it for the config the user gave them, and loading a
    checkpoint only with the user's consent (minitx.trained_model.load_checkpoint's trust_kind_modules)."""
    for name in names:
        try:
            if name.endswith(".py"):
                _import_file(Path(name))
            else:
                importlib.import_module(name)
        except UserError:
            raise
        except Exception as err:
            raise KindModuleError(
                f"attention.kind_modules: {name!r} cannot be imported ({type(err).__name__}: {err}); give a "
                "module name on the Python path or a .py file's path (relative paths start at the working directory)"
            ) from None


def import_config_kinds(attention: Any, prefix: str = "") -> None:
    """Import the kind_modules of an attention section the user wrote (a train or sweep config):
    naming them there is asking for their code to run. Errors name `prefix`attention.kind_modules."""
    modules = attention.get("kind_modules") if attention is not None else None
    if not modules:
        return
    if not isinstance(modules, (list, tuple)) or not all(isinstance(name, str) for name in modules):
        fail(f"{prefix}attention.kind_modules", f"is {modules!r}", "give a list of module names or .py files")
    try:
        import_kind_modules(list(modules))
    except UserError as error:
        raise UserError(f"{prefix}{error}") from None


def _import_file(path: Path) -> None:
    resolved = path.resolve()
    if not resolved.is_file():
        raise FileNotFoundError(f"no file {resolved}")
    module_name = f"minitx_kinds_{resolved.stem}_{zlib.crc32(str(resolved).encode()):08x}"
    if module_name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
