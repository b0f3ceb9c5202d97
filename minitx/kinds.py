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

import importlib
import importlib.util
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import options
from .errors import UserError, shown
from .options import fail, nearest


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
    kv_heads: Callable[[Any, int], int] = lambda attention, n_head: attention.n_kv_head or n_head
    reads_n_kv_head: bool = True
    check_model: Callable[[Any], None] | None = None
    reads_rope: bool = True


class KindModuleError(UserError):
    """A module named in attention.kind_modules cannot be imported."""


registry: dict[str, KindSpec] = {}


def register(spec: KindSpec) -> KindSpec:
    """Add a kind (or replace the one of the same name); returns the spec."""
    if spec.options is not None:
        options.check_options_class(f"kind {spec.name}", spec.options)
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
    return options.build_options(where, f"kind {kind}", spec.options, given)


# -- kinds defined outside minitx ------------------------------------------------------------------


def is_built_in(spec: KindSpec) -> bool:
    """Whether a kind is minitx's own (its layer class is defined inside the minitx package): the
    built-in kinds are held causal and exact by their tests, a kind from outside by verify/."""
    return (spec.module.__module__ + ".").startswith("minitx.")


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
