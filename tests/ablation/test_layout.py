"""minitx/ablation/'s layout: its docstring's map is true."""

from __future__ import annotations

import re
from pathlib import Path

from minitx import ablation

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "minitx" / "ablation"


def test_every_public_name_of_the_package_imports():
    for name in ablation.__all__:
        assert getattr(ablation, name) is not None, name


def named_paths(docstring: str) -> list[tuple[str, list[Path]]]:
    """Each file (name.py) and folder (name/) the docstring names, with where it may be: in the
    folder whose part of the map names it, else at the package's top, else the repository's."""
    found = []
    folder = PACKAGE
    for line in docstring.splitlines():
        indent = len(line) - len(line.lstrip())
        first = line.split()[0] if line.strip() else ""
        if indent == 4:  # the map's top level: a module of the package, or one of its folders
            folder = PACKAGE / first if first.endswith("/") else PACKAGE
        for name in re.findall(r"(?<![\w/<.-])[\w/]*\w\.py\b|(?<![\w/<.-])\w+/(?![\w<])", line):
            found.append((name, [folder / name, PACKAGE / name, ROOT / name]))
    return found


def test_the_package_docstring_names_only_files_that_exist():
    named = named_paths(ablation.__doc__)
    assert {"plan/", "runs/", "analysis/", "report/", "designed_sweep.py", "results.py"} <= {
        n for n, _ in named
    }
    missing = [name for name, places in named if not any(place.exists() for place in places)]
    assert not missing, (
        f"minitx/ablation/__init__.py's docstring names what is not there: {', '.join(missing)}"
    )


def test_the_package_docstring_names_every_module():
    named = {name for name, _ in named_paths(ablation.__doc__)}
    modules = sorted(p.name for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")
    assert not [m for m in modules if m not in named], "minitx/ablation/__init__.py's docstring lacks modules"


def test_the_check_finds_a_file_that_is_not_there():
    text = (
        "\n    runs/               running\n      runner.py         here\n      table.py          not here\n"
    )
    missing = [name for name, places in named_paths(text) if not any(p.exists() for p in places)]
    assert missing == ["table.py"]
