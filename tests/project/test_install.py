"""A fresh install gets what the suite passed with, and CI runs what the README tells a newcomer:
the README's two quickstart commands are the ones .ci/run runs, constraints.txt pins every direct
and test dependency, and the newest-releases job can name the package that moved."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / ".ci"))
import release_drift  # noqa: E402


def quickstart() -> list[str]:
    """The lines of the README's first bash block: install and train, install and test."""
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)[1]
    return [line.strip() for line in block.splitlines() if line.strip()]


def ci_lines() -> list[str]:
    return [
        line.strip()
        for line in (ROOT / ".ci/run").read_text().splitlines()
        if not line.lstrip().startswith("#")
    ]


def requirement_names(requirements: list[str]) -> set[str]:
    names = set()
    for requirement in requirements:
        name = re.match(r"[A-Za-z0-9_.\-]+", requirement)[0]
        if name != "minitx":  # the extras of minitx itself are listed in full below
            names.add(re.sub(r"[-_.]+", "-", name).lower())
    return names


def test_the_readme_quickstart_is_what_ci_runs():
    install_and_train, install_and_test = quickstart()
    assert install_and_test in ci_lines(), ".ci/run must run the README's test command word for word"
    # the training command installs the same way, without the test tools
    assert install_and_train == "pip install -c constraints.txt -e . && python train.py"
    assert install_and_test.startswith("pip install -c constraints.txt -e ")
    # after it, CI tries the lowest declared versions and the newest releases
    assert {".ci/lowest-versions", ".ci/newest-versions"} <= set(ci_lines())


def test_constraints_pin_every_direct_and_test_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = requirement_names(project["dependencies"] + [r for extra in extras.values() for r in extra])
    pinned = release_drift.pins(ROOT / "constraints.txt")
    assert wanted - pinned.keys() == set(), (
        "pin these in constraints.txt at the versions the suite passed with"
    )


def test_drift_lists_each_moved_package_with_both_versions(tmp_path):
    (tmp_path / "pins.txt").write_text(
        "# pins\ntorch==2.13.0\nPyTest==9.0.3\nnumpy==2.3.0 ; python_version>'3'\n"
    )
    (tmp_path / "frozen.txt").write_text("torch==2.13.0+cpu\npytest==9.2.0\nnumpy==2.3.0\nnew_package==1.0\n")
    moved = release_drift.changed(tmp_path / "pins.txt", tmp_path / "frozen.txt")
    assert moved == [("new-package", "unpinned", "1.0"), ("pytest", "9.0.3", "9.2.0")]


def test_blame_calls_a_failure_that_passes_again_unchanged_a_flaky_test(tmp_path, monkeypatch, capsys):
    """A test that fails on one draw and passes on the next is no release's fault: said so, and no
    package is reinstalled to find one."""
    test = tmp_path / "test_draw.py"
    test.write_text(
        "from pathlib import Path\n\ndef test_draw():\n"
        "    drawn = Path(__file__).with_name('drawn')\n"
        "    first = not drawn.exists()\n    drawn.touch()\n    assert not first\n"
    )
    cache = tmp_path / "cache"
    run = [sys.executable, "-m", "pytest", "-q", "-p", "cacheprovider", "-o", f"cache_dir={cache}", str(test)]
    assert subprocess.run(run, capture_output=True, cwd=tmp_path).returncode == 1
    (tmp_path / "changed.txt").write_text("no-such-package-here 1.0 2.0\n")  # reinstalling it would fail
    monkeypatch.chdir(tmp_path)
    assert release_drift.main(["blame", sys.executable, "changed.txt", str(cache)]) == 1
    said = capsys.readouterr().out
    assert "pass when run again with the same versions" in said and "no single package" not in said


@pytest.mark.slow  # pip installs a package twice
def test_blame_names_the_release_that_breaks_a_test(tmp_path):
    """A venv whose tests pass only with an older release: blame puts each moved package back and
    names the one that mends the failure."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    install = [python, "-m", "pip", "install", "-q", "--no-deps"]
    subprocess.run([*install, "iniconfig==2.0.0"], check=True)  # pytest's small dependency
    test = tmp_path / "test_old.py"
    test.write_text(
        "from importlib.metadata import version\n\ndef test_old():\n    assert version('iniconfig') == '2.0.0'\n"
    )
    subprocess.run([*install, "iniconfig==2.1.0"], check=True)
    cache = tmp_path / "cache"
    run = [python, "-m", "pytest", "-q", "-p", "cacheprovider", "-o", f"cache_dir={cache}", str(test)]
    assert subprocess.run(run, capture_output=True, cwd=tmp_path).returncode == 1
    (tmp_path / "changed.txt").write_text("iniconfig 2.0.0 2.1.0\n")
    assert release_drift.blame(python, tmp_path / "changed.txt", cache, cwd=tmp_path) == [
        "iniconfig 2.1.0 (constraints.txt pins 2.0.0)"
    ]
