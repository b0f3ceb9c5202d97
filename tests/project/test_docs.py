"""The docs say only what exists: every relative link and anchor in README.md and docs/ resolves,
and every --flag they show a command with is a flag of that command."""

from __future__ import annotations

import contextlib
import io
import re
from functools import cache
from pathlib import Path

import pytest

from minitx.cli import run_command

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
COMMAND = re.compile(r"python (?:-m )?((?:benchmarks/|scripts/)?\w+\.py)\b(.*)")
FLAG = re.compile(r"(?<![\w-])(--[A-Za-z][\w.\-]*)")
COMMANDS = {"train.py": "train", "prepare.py": "train", "generate.py": "generate"} | {
    f"{name}.py": name for name in ("evaluate", "ablate", "export")
}


def prose_and_code(path: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(line number, text) of the lines outside code blocks, and of those inside."""
    prose, code, fenced = [], [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced or line.startswith("    "):
            code.append((number, line))
        else:
            prose.append((number, line))
    return prose, code


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())  # markup, not text
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(path: Path) -> set[str]:
    found, seen = set(), {}
    for _, line in prose_and_code(path)[0]:
        if line.startswith("#"):
            base = slug(line.lstrip("#"))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in PAGES:
        for number, line in prose_and_code(page)[0]:
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):  # https:, mailto:
                    continue
                path, _, anchor = target.partition("#")
                resolved = (page.parent / path).resolve() if path else page
                where = f"{page.relative_to(ROOT)}:{number}: ({target})"
                if not resolved.exists():
                    broken.append(f"{where} no such file {resolved.relative_to(ROOT)}")
                elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                    broken.append(f"{where} no heading #{anchor} in {resolved.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


@cache
def command_flags(command: str) -> frozenset[str]:
    """The flags a command's --help lists (the train command: every dotted key LightningCLI knows)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        with contextlib.suppress(SystemExit):
            run_command(command, ["--help"])
    flags = set(FLAG.findall(out.getvalue()))
    if command == "train":
        flags.add("--verify")  # prepare.py: train's flags plus --verify
    return frozenset(flags)


def script_flags(script: str) -> frozenset[str]:
    """The flags a benchmark or script declares: its add_argument("--...") strings."""
    source = (ROOT / script).read_text(encoding="utf-8")
    return frozenset(re.findall(r"[\"'](--[A-Za-z][\w\-]*)[\"']", source)) | {"--help"}


@cache
def kind_options() -> dict[str, set[str]]:
    """Each attention kind's option names: the registry's, and those of the kinds that examples/
    define in their own files (read from the source, so that nothing is registered here)."""
    import ast
    from dataclasses import fields

    from minitx.kinds import registry

    found = {
        name: {f.name for f in fields(spec.options)} if spec.options else set()
        for name, spec in registry.items()
    }
    for path in (ROOT / "examples").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        classes = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
        for call in ast.walk(tree):
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "KindSpec" and call.args:
                options = next((k.value for k in call.keywords if k.arg == "options"), None)
                body = (
                    classes[options.id].body
                    if isinstance(options, ast.Name) and options.id in classes
                    else []
                )
                fields_ = {
                    n.target.id
                    for n in body
                    if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                }
                found[call.args[0].value] = fields_
    return found


def known(flag: str, allowed: frozenset[str]) -> bool:
    if flag in allowed:
        return True
    # An attention kind's option, --model.attention.options.<kind>.<option>: the parser takes a
    # dict there, so the option is checked against the kind's own options.
    prefix = "--model.attention.options."
    if flag.startswith(prefix) and "--model.attention.options" in allowed:
        kind, _, option = flag[len(prefix) :].partition(".")
        return option in kind_options().get(kind, ()) or (not option and kind in kind_options())
    return False


def shown_commands():
    """(page:line, script, the text after it) of every command the docs show."""
    for page in PAGES:
        prose, code = prose_and_code(page)
        lines = dict(code)
        for number, line in code:
            if line.rstrip().endswith("\\"):  # a command continued on the next line
                continue
            while lines.get(number - 1, "").rstrip().endswith("\\"):
                number -= 1
                line = lines[number].rstrip()[:-1] + " " + line
            for match in COMMAND.finditer(line.split("#")[0]):
                yield f"{page.relative_to(ROOT)}:{number}", match.group(1), match.group(2)
        for number, line in prose:
            for inline in re.findall(r"`([^`]*)`", line):
                for match in COMMAND.finditer(inline):
                    yield f"{page.relative_to(ROOT)}:{number}", match.group(1), match.group(2)


def test_every_flag_the_docs_show_exists_in_its_command():
    unknown = []
    for where, script, rest in shown_commands():
        if script in COMMANDS:
            allowed = command_flags(COMMANDS[script])
        elif (ROOT / script).is_file():
            allowed = script_flags(script)
        else:
            unknown.append(f"{where}: no script {script}")
            continue
        head, separator, tail = rest.partition(" -- ")  # ablate: training flags after --
        for flag in FLAG.findall(head):
            flag = flag.split("=")[0]
            if not known(flag, allowed):
                unknown.append(f"{where}: {script} has no flag {flag}")
        for flag in FLAG.findall(tail) if separator else []:
            if not known(flag.split("=")[0], command_flags("train")):
                unknown.append(f"{where}: train.py (after --) has no flag {flag}")
    assert not unknown, "\n".join(unknown)


@pytest.mark.parametrize("heading, anchor", [("## Data: `prepare.py` and more", "data-preparepy-and-more")])
def test_slugs_follow_github(heading, anchor):
    assert slug(heading.lstrip("#")) == anchor


def map_sections() -> dict[str, str]:
    """docs/architecture.md's map of minitx/, by entry: {'attention/': its lines, 'kinds.py': ...}.
    An entry starts at the map's first indentation under minitx/ and runs to the next; a line
    naming several files ('model.py cache.py') is one entry under its first name."""
    lines = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").splitlines()
    start = lines.index("    minitx/") + 1
    sections: dict[str, str] = {}
    name = None
    for line in lines[start:]:
        indent = len(line) - len(line.lstrip())
        if line.strip() and indent <= 4:
            break  # past minitx/: the scripts, examples/, configs/ ...
        if indent == 6:
            name = line.split()[0]
            sections[name] = ""
        sections[name] += line + "\n"
    return sections


def test_every_module_of_minitx_is_in_the_map():
    """Each module is named in docs/architecture.md: a module of a package (training/changes.py)
    within that package's entry, a top-level one (documents.py) in an entry of its own or shared."""
    sections = map_sections()
    top_level = "".join(text for name, text in sections.items() if not name.endswith("/"))
    missing = []
    for path in sorted((ROOT / "minitx").rglob("*.py")):
        relative = path.relative_to(ROOT / "minitx")
        if path.name == "__init__.py":
            continue
        package = f"{relative.parts[0]}/" if len(relative.parts) > 1 else None
        where = top_level if package is None else sections.get(package, "")
        if not re.search(rf"(?<![\w.]){re.escape(path.name)}(?!\w)", where):
            missing.append(str(relative))
    assert not missing, f"docs/architecture.md's map lacks: {', '.join(missing)}"
