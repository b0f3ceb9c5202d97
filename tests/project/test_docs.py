"""The docs say only what exists: every relative link and anchor in README.md and docs/ resolves,
every --flag they show a command with is a flag of that command, and every Python snippet
imports what exists (and runs, where it is whole)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import os
import re
import shlex
import subprocess
import sys
import textwrap
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
    """Each module is named in docs/architecture.md: a module of a package (training/resume.py)
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


# ------------------------------------------------------------------------------------------------
# Every command a docs page shows runs on a CPU machine as written, or says what it needs with a
# `[needs ...]` in its comment (`# [needs 4 GPUs] a copy per device`). The fast test checks each
# command line as its command would before doing any work (the keys, the values, the files, the
# device the config asks for); the slow one runs them, each cut short as the README's are.

NEEDS = re.compile(r"\[needs ([^\]]+)\]")
DOCS_PAGES = sorted((ROOT / "docs").glob("*.md"))  # docs/results/ records hours of sweeps: not run
# What a page's command names that a user brings: the test makes or substitutes each.
PLACEHOLDERS = {
    "CKPT": "runs/default/checkpoints/best.ckpt",
    "DIR": "hf/default",
    "A.yaml": "configs/default.yaml",
}
USER_FILES = {
    "web/a.jsonl": '{"text": "To be, or not to be, that is the question."}\n' * 400,
    "stories/a.jsonl": '{"text": "Once upon a time there was a little cat."}\n' * 4000,
    "corpus/a.txt": "Now is the winter of our discontent made glorious summer.\n" * 400,
    "prompt.txt": "ROMEO:",
}
GPU_ACCELERATORS = {"gpu", "cuda", "mps", "tpu"}


def docs_commands(page: Path) -> list[tuple[str, list[str], str | None]]:
    """(page:line, the command's words from the script on, what it needs or None) of each
    `python X.py ...` in the page's code blocks: continued lines joined, `&&` parts apart,
    variables set before it (MASTER_ADDR=...) and wrappers (/usr/bin/time) left out."""
    _, code = prose_and_code(page)
    lines = dict(code)
    found = []
    for number, line in code:
        if line.rstrip().endswith("\\"):
            continue
        start, comments = number, [line.partition("#")[2]]
        while lines.get(start - 1, "").rstrip().endswith("\\"):
            start -= 1
            head, _, comment = lines[start].rstrip()[:-1].partition("#")
            line, comments = head + " " + line, [comment, *comments]
        needs = NEEDS.search(" ".join(comments))
        for part in line.partition("#")[0].split("&&"):
            if not re.search(r"(^|\s)python\s", part):
                continue  # YAML, output, or a command of another program
            # `[--lm-eval-limit 100]`: an optional part, checked as if given
            words = shlex.split(re.sub(r"\[(--[^\]]*)\]", r"\1", part))
            while words and ("=" in words[0] or words[0].startswith("/usr/bin/")):
                words = words[1:]
            if words[:1] == ["python"] and words[1:2] != ["-m"] and len(words) > 1:
                where = f"{page.relative_to(ROOT)}:{start}"
                found.append((where, [PLACEHOLDERS.get(w, w) for w in words[1:]], needs and needs[1]))
    return found


def all_docs_commands() -> list[tuple[str, list[str], str | None]]:
    return [command for page in DOCS_PAGES for command in docs_commands(page)]


def clone(work: Path) -> Path:
    """A directory that starts like a fresh clone (no runs/), with the files a user brings."""
    work.mkdir(parents=True)
    for name in ("configs", "examples", "scripts", "benchmarks", *[p.name for p in ROOT.glob("*.py")]):
        (work / name).symlink_to(ROOT / name)
    for name, text in USER_FILES.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text, encoding="utf-8")
    return work


def option(words: list[str], flag: str) -> str | None:
    for i, word in enumerate(words):
        if word == flag and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(flag + "="):
            return word.partition("=")[2]
    return None


def cpu_problem(words: list[str]) -> str | None:
    """Why the command, accepted by its parser, cannot run on a CPU machine without the network
    (what its page must then say), or None. Raises the UserError its command would raise."""
    from minitx.files.configs import CommandLine

    script, args = words[0], words[1:]
    if "..." in args:
        return "it is an outline (...), not a command"
    if script in ("train.py", "prepare.py"):
        from minitx.training.precheck import check_arguments, light_parser, to_judge, trainer_argument_names

        own = [a for a in args if a != "--verify"]
        line = CommandLine.read(own, default_config=True)
        check_arguments(line, own_flags=["--verify"])
        config = light_parser().parse_args(to_judge(line.args, trainer_argument_names()))
        if config["data"]["source"] == "hf":
            return "its data comes from the Hugging Face Hub"
        if script == "prepare.py":
            return None
        trainer = config["trainer"]
        if str(trainer.get("accelerator")) in GPU_ACCELERATORS:
            return f"trainer.accelerator is {trainer['accelerator']}"
        if int(trainer.get("num_nodes") or 1) > 1:
            return "it spans machines (trainer.num_nodes)"
        return None
    if script == "ablate.py":
        import yaml

        from minitx.ablation.command import check_readable, parse_args
        from minitx.ablation.plan.sweep import load_sweep

        parsed = parse_args(args)
        if parsed.launcher == "slurm":
            return "it submits to SLURM"
        check_readable(Path(parsed.config))
        base = yaml.safe_load(load_sweep(Path(parsed.config)).base_text) or {}
        accelerator = option(parsed.train_args, "--trainer.accelerator") or (base.get("trainer") or {}).get(
            "accelerator"
        )
        return f"trainer.accelerator is {accelerator}" if str(accelerator) in GPU_ACCELERATORS else None
    if script in COMMANDS:
        parsed = importlib.import_module(PARSERS[script]).parse_args(args)
        if str(getattr(parsed, "device", "cpu")).startswith(("cuda", "mps")):
            return f"--device {parsed.device}"
        if getattr(parsed, "lm_eval_tasks", None):
            return "lm-eval's tasks download their data"
        return None
    if script == "benchmarks/gpu.py" and option(args, "--device") != "cpu":
        return "benchmarks/gpu.py runs on CUDA without --device cpu"
    if script == "scripts/collect_wheels.py":
        return "it downloads wheels"
    return None


PARSERS = {
    "generate.py": "minitx.generation.command",
    "evaluate.py": "minitx.evaluation.command",
    "export.py": "minitx.hf.command",
}


def test_every_docs_command_runs_on_a_cpu_or_says_what_it_needs(tmp_path, monkeypatch):
    """docs/scale.md showed `--config configs/gpu.yaml --trainer.devices 2 --trainer.strategy ddp`
    as tested on a CPU: on one it ends `No supported gpu backend found!`."""
    from minitx.errors import UserError
    from minitx.training import precheck

    # One parser for the thirty train commands (building it is most of a check's time).
    monkeypatch.setattr(precheck, "light_parser", functools.cache(precheck.light_parser))
    monkeypatch.chdir(clone(tmp_path / "clone"))
    commands = all_docs_commands()
    assert len(commands) >= 40 and any(needs for *_, needs in commands)
    wrong = []
    for where, words, needs in commands:
        if not (ROOT / words[0]).is_file():
            wrong.append(f"{where}: no script {words[0]}")
            continue
        try:
            problem = cpu_problem(words)
        except UserError as error:
            wrong.append(f"{where}: {' '.join(words)}: refused: {error}")
            continue
        if problem and not needs:
            wrong.append(f"{where}: {' '.join(words)}: {problem}; say what it needs: # [needs ...]")
    assert not wrong, "\n".join(wrong)


def test_the_sweep_snippet_of_the_ablations_page_works_outside_configs(tmp_path):
    """Its `base: default.yaml`, copied into a file of one's own elsewhere, is minitx's config."""
    from minitx.ablation.plan.sweep import load_sweep

    text = (ROOT / "docs" / "ablations.md").read_text(encoding="utf-8")
    snippet = re.search(r"```yaml\n(base: default\.yaml.*?)```", text, re.S).group(1)
    (tmp_path / "my_sweep.yaml").write_text(snippet, encoding="utf-8")
    sweep = load_sweep(tmp_path / "my_sweep.yaml")
    assert sweep.base_text == (ROOT / "configs" / "default.yaml").read_text(encoding="utf-8")
    assert [v.name for v in sweep.variants] == ["mha", "mqa"]


# ------------------------------------------------------------------------------ python snippets
PYTHON_BLOCK = re.compile(r"^( *)```python\n(.*?)^\1```", re.S | re.M)


def python_snippets() -> list[tuple[str, str]]:
    """(page:line, code) of every ```python block of README.md and docs/, dedented."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in PYTHON_BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", textwrap.dedent(match.group(2))))
    return found


def free_names(code: str) -> set[str]:
    """The names a snippet reads that it neither binds nor imports, builtins aside: a fragment's
    (a method, an options class) where there are some, which the page's example file defines."""
    import builtins
    import symtable

    top = symtable.symtable(code, "<snippet>", "exec")
    bound = {
        s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace()
    }
    read, tables = set(), [top]
    while tables:
        table = tables.pop()
        tables += table.get_children()
        for symbol in table.get_symbols():
            global_here = table is top or symbol.is_global()
            if global_here and symbol.is_referenced():
                read.add(symbol.get_name())
    return read - bound - set(dir(builtins))


@cache
def example_names() -> frozenset[str]:
    """What minitx exports and examples/*.py define or import at their top level: the names a
    fragment of the docs may take from the page it stands on."""
    import ast

    import minitx

    names = set(dir(minitx))
    for path in (ROOT / "examples").glob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
            elif isinstance(node, ast.Assign):
                names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
    return frozenset(names)


@pytest.mark.parametrize("where, code", python_snippets(), ids=lambda value: str(value)[:40])
def test_every_python_snippet_of_the_docs_imports_and_runs(where, code, tmp_path, monkeypatch):
    """Each block compiles and every name it imports exists; a whole one (it binds every name it
    reads) runs, unless it reads a run's files (`runs/...`, made by a page's commands: the slow
    docs-command test trains those); a fragment's other names are minitx's or its example's."""
    import ast

    tree = ast.parse(code, where)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom):
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{where}: {node.module} has no {alias.name}"
    free = free_names(code)
    unknown = sorted(free - example_names())
    assert not unknown, f"{where}: uses {', '.join(unknown)}, which neither it, minitx nor examples/ define"
    if free or "runs/" in code:
        return
    monkeypatch.chdir(tmp_path)  # whatever it writes, it writes here
    exec(compile(tree, where, "exec"), {"__name__": "docs_snippet"})


def docs_run_commands() -> list[tuple[str, list[str]]]:
    return [(where, words) for where, words, needs in all_docs_commands() if not needs]


# A docs command cut short (the README test's cuts: tests/project/test_readme_examples.py), and
# what it needs made first in its fresh clone: the run a checkpoint path names, an export, a file.
SHORT_TRAIN = [
    "--trainer.max_steps", "4", "--trainer.val_check_interval", "2", "--data.val_batches", "1",
    "--data.batch_size", "4", "--run.sample_tokens", "0", "--trainer.enable_model_summary", "false",
]  # fmt: skip
SHORT_WARMUP = ["--model.warmup_steps", "1"]
SHORT = {
    "scripts/make_speeches.py": ["--plays", "2"],
    "generate.py": ["--max-new-tokens", "5"],
    "evaluate.py": ["--max-tokens", "2000", "--sweep-tokens", "500"],
}


def shortened(words: list[str], work: Path) -> list[str]:
    script = words[0]
    if script in ("train.py", "prepare.py"):
        words = list(words)
        for flag, short in (("--model.decay_steps", "1"), ("--data.max_tokens", "200000")):
            if flag in words:  # a decay of 300 steps in a run cut to 4; a billion tokens to prepare
                words[words.index(flag) + 1] = short
        return [*words, *(SHORT_TRAIN if script == "train.py" else [])]
    if script == "ablate.py":
        from minitx.ablation.plan.sweep import load_sweep

        config = option(words, "--config")
        sweep = load_sweep(work / config)
        output = [] if option(words, "--output") else ["--output", "runs/ablation/docs"]
        if sweep.design.active:  # a designed sweep of many runs: its plan is checked, not trained
            return [*words, *output, "--dry-run"]
        only = ",".join(v.name for v in sweep.variants[:2])
        cut = words.index("--") if "--" in words else len(words)  # training flags after --
        head, tail = words[:cut], words[cut + 1 :]
        # a sweep refuses a warmup as long as its runs (runner.check_variants): cut it with them
        return [*head, *output, "--seeds", "1", "--only", only, "--", *tail, *SHORT_TRAIN[:6], *SHORT_WARMUP]
    return [*words, *SHORT.get(script, [])]


def prerequisites(words: list[str], work: Path) -> list[list[str]]:
    """The commands that make what `words` reads in a fresh clone, first to last."""
    before: list[list[str]] = []
    for flag in ("--ckpt", "--model.init_from", "--ckpt_path"):
        path = option(words, flag)
        if path is None or (work / path).exists():
            continue
        if path == "last":  # the same run, shorter, to resume
            first = [w for w in words if w not in ("--ckpt_path", "last")]
            before.append([*shortened(first, work), "--trainer.max_steps", "2"])
            continue
        parts = Path(path).parts
        if parts[0] == "hf":  # an export of the default run
            before += [
                ["train.py", *SHORT_TRAIN],
                ["export.py", "--ckpt", PLACEHOLDERS["CKPT"], "--out", path],
            ]
        elif parts[0] == "runs":
            name = parts[1]
            config = (
                f"configs/{name}.yaml"
                if (ROOT / "configs" / f"{name}.yaml").is_file()
                else "configs/default.yaml"
            )
            before.append(
                ["train.py", "--config", config, "--run.name", name, *SHORT_TRAIN, "--trainer.max_steps", "2"]
            )
            if "checkpoints" not in parts:  # a checkpoint a user copied aside (stable.ckpt)
                before.append(["cp", f"runs/{name}/checkpoints/last.ckpt", path])
    if "data/speeches.jsonl" in words:
        before.append(["scripts/make_speeches.py", *SHORT["scripts/make_speeches.py"]])
    return before


@pytest.mark.slow
@pytest.mark.parametrize("where, words", docs_run_commands(), ids=lambda value: str(value)[:60])
def test_a_docs_command_runs_on_a_cpu(where, words, tmp_path):
    work = clone(tmp_path / "clone")
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(ROOT)}
    for step in [*prerequisites(words, work), shortened(words, work)]:
        command = step if step[0] == "cp" else [sys.executable, *step]
        result = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, (
            f"{where}: {' '.join(step)}\n{result.stdout[-1500:]}\n{result.stderr[-1500:]}"
        )
