"""minitx's modules import one another without circles.

A circle (a imports b, which imports a, perhaps through others) makes the order of loading
matter and forces imports into function bodies to dodge it; it also says two modules are one
concept split in the wrong place. The graph is read from the source with ast, imports inside
functions included (they run too, only later), so the test needs no import of minitx.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def module_names(root: Path = ROOT, package: str = "minitx") -> dict[str, Path]:
    """Every module of the package by dotted name; a package by its own name (its __init__.py)."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that module `name` (at `path`) imports, anywhere in its body.

    `from a import b` imports a.b when that is a module, else a (b is a name defined there);
    `import a.b.c` names its deepest prefix that is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def deepest(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(deepest(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.add(child if child in modules else deepest(base))
    found.discard(None)
    found.discard(name)
    return found


def import_graph(root: Path = ROOT, package: str = "minitx") -> dict[str, set[str]]:
    modules = module_names(root, package)
    return {name: imported(name, path, modules) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each
    sorted: every module in one reaches every other, so each is one circle or several tangled."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_circles_are_found_in_a_made_up_graph():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert circles(graph) == [["a", "b", "c"], ["d", "e"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_imports_are_read_inside_functions_and_relative_to_the_package(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    for name in ("__init__", "top", "sub/__init__", "sub/one", "sub/two"):
        (tmp_path / "pkg" / f"{name}.py").write_text("")
    (tmp_path / "pkg" / "sub" / "one.py").write_text(
        "from . import two\nfrom ..top import VALUE\n"
        "def late():\n    import pkg.sub\n    from .two import thing\n"
    )
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.sub.one"] == {"pkg.sub.two", "pkg.top", "pkg.sub"}


def test_minitx_has_no_import_circles():
    found = circles(import_graph())
    assert not found, "modules that import one another (move the shared names to a module both import):\n" + (
        "\n".join(" <-> ".join(component) for component in found)
    )


# minitx/ablation/'s stages, in the order a sweep goes through them: each may import only the
# stages before it, so a stage can be read (and tested) knowing nothing of the later ones. The
# modules at the package's top (command.py, plain_sweep.py, designed_sweep.py, ...) drive the
# stages and sit above them all.
STAGES = ("plan", "runs", "analysis", "report")
ABLATION = "minitx.ablation"


def stage_of(module: str) -> int | None:
    """The stage a module of minitx/ablation/ belongs to (an index into STAGES); len(STAGES) for
    the package's top, above them all; None outside minitx/ablation/."""
    if module != ABLATION and not module.startswith(ABLATION + "."):
        return None
    folder = module[len(ABLATION) + 1 :].split(".")[0]
    return STAGES.index(folder) if folder in STAGES else len(STAGES)


def against_the_stages(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a stage's module from a later stage or from the package's top."""
    found = []
    for name, targets in sorted(graph.items()):
        stage = stage_of(name)
        if stage is None or stage == len(STAGES):
            continue
        later = [target for target in sorted(targets) if (stage_of(target) or 0) > stage]
        found += [f"{name} -> {target}" for target in later]
    return found


def test_the_stage_rule_is_read_from_a_made_up_graph():
    graph = {
        "minitx.ablation.plan.ladder": {"minitx.ablation.plan.sweep", "minitx.errors"},
        "minitx.ablation.runs.runner": {"minitx.ablation.plan.ladder", "minitx.ablation.analysis.table"},
        "minitx.ablation.analysis.table": {"minitx.ablation.command"},
        "minitx.ablation.report.plain": {"minitx.ablation.analysis.table", "minitx.ablation.runs.runner"},
        "minitx.ablation.command": {"minitx.ablation.report.plain"},
    }
    assert against_the_stages(graph) == [
        "minitx.ablation.analysis.table -> minitx.ablation.command",
        "minitx.ablation.runs.runner -> minitx.ablation.analysis.table",
    ]


def test_each_stage_of_ablation_imports_only_the_stages_before_it():
    found = against_the_stages(import_graph())
    assert not found, (
        f"imports against minitx/ablation/'s stages ({' -> '.join(STAGES)}; the package's top above them): "
        + "; ".join(found)
    )


# A folder of minitx is one room of the house: it stands either below a module or above it, never
# both. files/ stood both (its checkpoint reader built the model, while the model's config read
# files/upgrade.py), and so did generation/ (the model ran its decode loop, while its command loads
# a trained model): each such folder is a circle of rooms, which the file graph does not show.
PACKAGE = "minitx"


def room_of(module: str) -> str:
    """The room a module of minitx stands in: its folder right under minitx/, or itself."""
    parts = module.split(".")
    return ".".join(parts[:2])


def rooms_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph with each folder right under minitx/ drawn as one room (minitx's own
    __init__.py, which only hands names on, is left out: it imports what it exports)."""
    rooms: dict[str, set[str]] = {}
    for name, targets in graph.items():
        if name == PACKAGE:
            continue
        room = room_of(name)
        rooms.setdefault(room, set()).update(
            room_of(target) for target in targets if target != PACKAGE and room_of(target) != room
        )
    return rooms


def test_rooms_are_read_from_a_made_up_graph():
    graph = {
        "minitx.files.checkpoint": {"minitx.model", "minitx.files.atomic"},
        "minitx.files.upgrade": set(),
        "minitx.model": {"minitx.config"},
        "minitx.config": {"minitx.files.upgrade"},
    }
    assert rooms_graph(graph) == {
        "minitx.files": {"minitx.model"},
        "minitx.model": {"minitx.config"},
        "minitx.config": {"minitx.files"},
    }
    assert circles(rooms_graph(graph)) == [["minitx.config", "minitx.files", "minitx.model"]]


def test_no_folder_of_minitx_stands_both_below_and_above_another_room():
    found = circles(rooms_graph(import_graph()))
    assert not found, "folders of minitx both below and above another room (move the part above out):\n" + (
        "\n".join(" <-> ".join(component) for component in found)
    )


def test_files_is_input_and_output_only():
    """files/ reads and writes; it builds nothing (the model from a checkpoint: trained_model.py)."""
    allowed = {"minitx.errors"}
    found = {
        name: sorted(
            target for target in targets if room_of(target) != "minitx.files" and target not in allowed
        )
        for name, targets in import_graph().items()
        if room_of(name) == "minitx.files"
    }
    assert not any(found.values()), f"files/ imports more than input and output needs: {found}"


def test_a_kind_imports_no_other_kind():
    """A kind reads in its own files and the shared ones (kind_layer.py, softmax.py, sinks.py):
    mha's path from the model to the softmax passes through no other kind's file."""
    shared = {
        "minitx.attention",
        "minitx.attention.kind_layer",
        "minitx.attention.softmax",
        "minitx.attention.sinks",
    }

    def kind_of(module: str) -> str | None:
        parts = module.split(".")
        return None if module in shared or parts[:2] != ["minitx", "attention"] else parts[2]

    found = {
        name: sorted(others)
        for name, targets in import_graph().items()
        if kind_of(name) is not None
        and (others := {t for t in targets if kind_of(t) not in (None, kind_of(name))})
    }
    assert not found, f"attention kinds import another kind: {found}"
