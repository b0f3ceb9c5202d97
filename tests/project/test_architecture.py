"""docs/architecture.md's "Where to add" table names files that exist, and names each sort once.

The table tells a contributor which files a new kind, task, statistic, diagnostic or optimiser
touches; a file that moved would send them to nothing. A path with `<name>` stands for the new
thing's own file: the folder it goes in must exist, and hold at least one such file already.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SORTS = ("an attention kind", "a known-answer task", "a statistic of a sweep", "a diagnostic", "an optimiser")


def where_to_add(text: str) -> dict[str, list[str]]:
    """The table's rows: the sort (its first cell) -> the paths its cells name in backticks (any
    backticked word with a slash, or ending in .py or .md)."""
    section = text.split("## Where to add", 1)[1]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 2 or set(cells[0]) <= {"-", " "} or cells[0] == "to add":
            continue
        named = re.findall(r"`([^`\s]+)`", " ".join(cells[1:]))
        rows[cells[0]] = [path for path in named if "/" in path or path.endswith((".py", ".md"))]
    return rows


def missing_paths(rows: dict[str, list[str]], root: Path = ROOT) -> list[str]:
    missing = []
    for sort, paths in rows.items():
        for path in paths:
            if "<name>" in path:
                folder = root / path.split("<name>")[0]
                suffix = path.split("<name>")[1]
                if not folder.is_dir() or not any(folder.glob(f"*{suffix}")):
                    missing.append(f"{sort}: {path}")
            elif not (root / path).exists():
                missing.append(f"{sort}: {path}")
    return missing


def test_the_table_is_read_and_a_wrong_path_is_found(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "one.py").write_text("")
    text = (
        "# Map\n\n## Where to add\n\n| to add | its file |\n| --- | --- |\n"
        "| a thing | `pkg/<name>.py`, then `pkg/one.py` and `pkg/gone.py` (`run_it`) |\n"
    )
    rows = where_to_add(text)
    assert rows == {"a thing": ["pkg/<name>.py", "pkg/one.py", "pkg/gone.py"]}
    assert missing_paths(rows, tmp_path) == ["a thing: pkg/gone.py"]


def test_every_file_the_where_to_add_table_names_exists():
    rows = where_to_add((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert tuple(rows) == SORTS
    assert all(rows[sort] for sort in SORTS), rows
    missing = missing_paths(rows)
    assert not missing, "docs/architecture.md's 'Where to add' names what is not there: " + "; ".join(missing)
