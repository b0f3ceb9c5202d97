"""Collect the wheels minitx needs on a machine without internet, beyond what its Python already has.

On the machine without internet (a GPU node with its own torch, say):

    python -m pip list --format=freeze > have.txt

Here, with internet, from the project's root (Python version and platform of the target):

    python scripts/collect_wheels.py --have have.txt --python-version 3.12 --out wheels/
    python scripts/collect_wheels.py --have have.txt --python-version 3.11 --platform manylinux_2_28_aarch64 --out wheels/ --extras hf

Copy wheels/ over, then there:

    python -m pip install --no-index --find-links wheels/ minitx

How: minitx is built into a wheel of its own (pure Python); pip resolves minitx's requirements for
the target (`pip install --dry-run --report`, which reads wheel metadata without downloading whole
wheels where the index serves it), holding every package listed in --have at its installed
version, so the result fits the target's torch instead of replacing it; then each package the
target lacks is downloaded as a binary wheel (`pip download --only-binary=:all: --no-deps`) for the
target's Python version and platform. Nothing is installed here. Without --have, everything is
collected, torch included (several GB for CUDA builds).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINUX_X86 = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        print(f"collect_wheels.py: {message}", file=sys.stderr)
        raise SystemExit(2)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_have(path: Path) -> dict[str, str]:
    """name -> version from `pip list --format=freeze` (or `pip freeze`) output; other lines skipped
    (editable installs, direct references, comments)."""
    have = {}
    for line in path.read_text().splitlines():
        match = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9_.\-]*)==([^\s;#]+)\s*", line)
        if match:
            have[canonical(match.group(1))] = match.group(2)
    return have


def target_options(args) -> list[str]:
    options = ["--only-binary=:all:", "--python-version", args.python_version, "--implementation", "cp"]
    for platform in args.platform or LINUX_X86:
        options += ["--platform", platform]
    return options


def pip(*arguments: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *arguments], check=True)


def wanted(report: dict, have: dict[str, str]) -> list[tuple[str, str]]:
    """(name, version) of each package pip would install that the target does not have, minitx aside."""
    rows = []
    for item in report["install"]:
        name, version = canonical(item["metadata"]["name"]), item["metadata"]["version"]
        if name != "minitx" and have.get(name) != version:
            rows.append((name, version))
    return sorted(rows)


def main(argv=None) -> int:
    parser = Parser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", required=True, type=Path, help="directory the wheels go to")
    parser.add_argument("--have", type=Path, help="`pip list --format=freeze` of the target's environment")
    parser.add_argument(
        "--python-version",
        default=f"{sys.version_info[0]}.{sys.version_info[1]}",
        help="the target's, e.g. 3.12",
    )
    parser.add_argument(
        "--platform",
        action="append",
        help=f"a wheel platform tag of the target (repeat); default {' '.join(LINUX_X86)}",
    )
    parser.add_argument("--extras", default="", help="minitx extras to include, comma separated: hf, eval")
    args = parser.parse_args(argv)
    if args.have is not None and not args.have.is_file():
        parser.error(
            f"--have: {args.have} is not a file (make it on the target: python -m pip list --format=freeze)"
        )
    if not re.fullmatch(r"3\.\d+", args.python_version):
        parser.error(f"--python-version: {args.python_version!r} is not a version such as 3.12")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out: {args.out} exists and is not a directory")
    extras = [e.strip() for e in args.extras.split(",") if e.strip()]
    unknown = sorted(set(extras) - {"hf", "eval"})
    if unknown:
        parser.error(f"--extras: unknown {', '.join(unknown)}; choose from hf, eval")
    have = read_have(args.have) if args.have else {}

    args.out.mkdir(parents=True, exist_ok=True)
    pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(args.out), str(REPO))
    built = max(args.out.glob("minitx-*.whl"), key=lambda p: p.stat().st_mtime)
    with tempfile.TemporaryDirectory() as work:
        constraints = Path(work) / "have.txt"
        constraints.write_text(
            "".join(f"{name}=={version}\n" for name, version in have.items() if name != "minitx")
        )
        report_path = Path(work) / "report.json"
        requirement = f"minitx[{','.join(extras)}] @ {built.resolve().as_uri()}" if extras else str(built)
        pip(
            "install",
            "--quiet",
            "--dry-run",
            "--ignore-installed",
            "--report",
            str(report_path),
            "--target",
            str(Path(work) / "target"),
            "-c",
            str(constraints),
            *target_options(args),
            requirement,
        )
        report = json.loads(report_path.read_text())
    rows = wanted(report, have)
    for name, version in rows:
        pip(
            "download",
            "--quiet",
            "--no-deps",
            "--dest",
            str(args.out),
            *target_options(args),
            f"{name}=={version}",
        )
    print(
        f"{len(rows)} wheels besides {built.name} in {args.out}; the target already has {len(have)} packages"
    )
    print(f"on the target: python -m pip install --no-index --find-links {args.out} minitx")
    return 0


if __name__ == "__main__":
    sys.exit(main())
