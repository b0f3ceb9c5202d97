"""Which newer release broke a test: the helper of .ci/newest-versions.

release_drift.py changed PINS FROZEN        lines "name pinned newest" for each package that moved
release_drift.py blame PYTHON CHANGED CACHE  reruns pytest's last failures as they are (passing: a
                                             flaky test), then puts each moved package back to its
                                             pin alone and reruns them; names each that mends them
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path


def pins(path: Path) -> dict[str, str]:
    """name -> version of every `name==version` line (a constraints file, or pip freeze's output)."""
    found = {}
    for line in path.read_text().splitlines():
        match = re.match(r"\s*([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*==\s*([^\s;#]+)", line)
        if match:
            found[re.sub(r"[-_.]+", "-", match[1]).lower()] = match[2]
    return found


def changed(pinned_file: Path, frozen_file: Path) -> list[tuple[str, str, str]]:
    pinned, frozen = pins(pinned_file), pins(frozen_file)
    # a local label is the build, not the release: torch 2.13.0+cpu is the pinned 2.13.0
    return [(name, pinned.get(name, "unpinned"), version) for name, version in sorted(frozen.items())
            if pinned.get(name) != version.split("+")[0]]  # fmt: skip


def rerun_failures(python: str, cache: Path, cwd: Path) -> bool:
    """True when pytest's last failures (read from its cache; ids relative to cwd) pass now."""
    failed = json.loads((cache / "v" / "cache" / "lastfailed").read_text())
    command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *sorted(failed)]
    return (
        subprocess.run(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    )


def blame(python: str, changed_file: Path, cache: Path, cwd: Path = Path(".")) -> list[str]:
    culprits = []
    for line in changed_file.read_text().splitlines():
        name, pinned, newest = line.split()
        if pinned == "unpinned":
            continue
        install = [python, "-m", "pip", "install", "-q", "--no-deps"]
        if subprocess.run([*install, f"{name}=={pinned}"], capture_output=True).returncode != 0:
            continue
        if rerun_failures(python, cache, cwd):
            culprits.append(f"{name} {newest} (constraints.txt pins {pinned})")
        subprocess.run([*install, f"{name}=={newest}"], capture_output=True, check=True)
    return culprits


def main(argv: list[str]) -> int:
    if argv[:1] == ["changed"] and len(argv) == 3:
        for name, pinned, newest in changed(Path(argv[1]), Path(argv[2])):
            print(name, pinned, newest)
        return 0
    if argv[:1] == ["blame"] and len(argv) == 4:
        # First the failures again with nothing changed: a test that passes now had failed on its
        # draw of random inputs (each test draws a fresh seed), and no release is to blame.
        if rerun_failures(argv[1], Path(argv[3]), Path(".")):
            print("newest releases: the failed tests pass when run again with the same versions: a test "
                  "that fails on some random draws, not a release; replay it with the seed it printed")  # fmt: skip
            return 1
        culprits = blame(argv[1], Path(argv[2]), Path(argv[3]))
        if culprits:
            print("newest releases: the fast suite fails with " + "; ".join(culprits)
                  + ": fix the test or code, then move the pin in constraints.txt")  # fmt: skip
        else:
            print("newest releases: the fast suite fails, and no single package back at its pin mends it: "
                  "see the differences listed above")  # fmt: skip
        return 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
