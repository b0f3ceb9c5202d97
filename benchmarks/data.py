"""The streaming data pipeline (issue 19): prepare throughput, start time and memory, on corpora of 100 MB to 4 GB.

    python benchmarks/data.py                                  # 100MB 1GB 4GB, char and bpe (~15 GB of disk)
    python benchmarks/data.py --sizes 100MB 1GB --tokenizers char --work /work/bench --keep
    python benchmarks/data.py --tiny                           # a 1 MB corpus, every step once (under a minute)

The script writes its own corpora: the lines of the built-in Shakespeare
(`minitx.data.sources.shakespeare_text()`, training and validation plays), shuffled with a fixed
seed and repeated until the size is reached, streamed to `<work>/corpus-<size>.txt` (a corpus
already there under that name is reused). Every measurement runs the project's own command as a
subprocess while a thread samples the memory of its whole process tree every 50 ms: the PSS of
the process and of all its descendants, from /proc/PID/smaps_rollup, summed (PSS splits a
shared page between the processes that map it, so pages that workers share count once).

Steps, each from an empty cache directory for that corpus and tokenizer:
  prepare   `python prepare.py --data.source files --data.train_files CORPUS --data.val_fraction 0.01 ...`
            MB/s is MB of corpus text per second of the command's wall time.
  start     `python train.py ... --trainer.max_steps 1` on the prepared data, with a small model
            (1 layer, d_model 32, block 64, batch 4) so that the step itself is negligible; wall
            time of the whole command, and the time to its "minitx: run directory" line (printed
            just before fit). The same run on the default source (Shakespeare, prepared first) is
            the reference.
  train     a longer run on the prepared corpus (char; block 64 x batch 256 by default, enough steps
            to draw as many tokens as the corpus holds, capped by --train-steps, 2000, and by
            --train-seconds, 180, after which it gets SIGINT and stops at the end of its step;
            the table says how much of the shards' 4 KB pages the random windows read): PSS over time, to show that memory
            stays flat while training reads more and more of the data (an mmap'd shard whose
            pages stay mapped would grow by every page read).
  baseline  (BPE only) a small program using the `tokenizers` library directly: the byte-level
            BPE that minitx trains (`minitx/data/tokenizer.py` `train_bpe`'s settings), trained
            with `train_from_iterator` on the whole corpus fed as lists of lines, then
            `encode_batch` on blocks of lines, ids written to disk as uint16; RAYON_NUM_THREADS
            set to the number of cores. minitx's prepare gets `--data.num_proc` the same number.

Targets (issue 19), each checked in the table's last column:
  * peak PSS of the process tree at most 1.5 GB, preparing and training, at every corpus size;
  * char prepare at least 100 MB/s (on 2 cores);
  * BPE prepare within 1.25x of the tokenizers baseline's wall time;
  * a start on the largest prepared corpus within 1 s of the Shakespeare start, memory flat;
  * memory flat over a long run: PSS no more than 64 MB (or 10%) above its value a tenth of the way
    into fit (after the first steps' allocations), at any later sample.

Each command's output is in <work>/logs/<step>.log, its PSS series in <step>.pss.tsv.
Sizes are decimal (100MB = 10**8 bytes). The work directory defaults to a temporary directory
under /tmp, deleted at the end unless --keep; with --work DIR the corpora stay there for the
next run and only the prepared data and runs are deleted (unless --keep). Disk needed: the
corpora plus about twice the largest corpus of uint16 token shards (caches are deleted as soon
as a corpus is done with, unless --keep). Prepare runs before prepare.py existed fall back to a
one-step train.py run, and the table says so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEAK_PSS_TARGET_MB = 1500.0
CHAR_MB_PER_S_TARGET = 100.0
BPE_RATIO_TARGET = 1.25
START_DIFF_TARGET_S = 1.0
FLAT_GROWTH_MB = 64.0
START_MARKER = "minitx: run directory"
SEED = 19

# ------------------------------------------------------------------------------------------------
# Memory of a process tree


def _parent_pids() -> dict[int, int]:
    """pid -> parent pid of every process visible in /proc (processes may vanish while we read)."""
    parents: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return parents
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                data = stat.read()
        except OSError:  # gone since listdir, or not ours to read
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'.
        fields = data.rpartition(b")")[2].split()
        if len(fields) >= 2:
            parents[int(name)] = int(fields[1])
    return parents


def tree_pids(root: int) -> list[int]:
    """`root` and all its descendants that are alive now (root first)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parent_pids().items():
        children.setdefault(ppid, []).append(pid)
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, ()))
    return found


def pss_bytes(pid: int) -> int:
    """Proportional set size of one process, 0 if it has exited (or is a zombie with no memory)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
            for line in rollup:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def tree_pss_bytes(root: int) -> int:
    """PSS summed over `root` and its descendants: shared pages count once in the sum."""
    return sum(pss_bytes(pid) for pid in tree_pids(root))


class TreeMemorySampler:
    """Samples `tree_pss_bytes(pid)` every `interval` seconds in a thread, between start() and stop().

    `samples` holds (seconds since start, PSS bytes, processes in the tree); `peak_bytes` the largest.
    """

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = 0.0

    def sample(self) -> None:
        pids = tree_pids(self.pid)
        total = sum(pss_bytes(pid) for pid in pids)
        if total:
            self.samples.append((time.perf_counter() - self._t0, total, len(pids)))

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval):
                return

    def start(self) -> TreeMemorySampler:
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def stop(self) -> TreeMemorySampler:
        self._stop.set()
        self._thread.join()
        return self

    @property
    def peak_bytes(self) -> int:
        return max((s[1] for s in self.samples), default=0)


# ------------------------------------------------------------------------------------------------
# Running one command


@dataclass
class Result:
    name: str
    command: list[str]
    log: Path
    returncode: int = 0
    wall_s: float = 0.0
    marker_s: float | None = None  # when a line starting with the marker was printed
    samples: list[tuple[float, int, int]] = field(default_factory=list)
    stdout_tail: list[str] = field(default_factory=list)
    interrupted: bool = False  # stopped by us with SIGINT after its time

    @property
    def ok(self) -> bool:
        return self.returncode == 0 or (self.interrupted and self.returncode == 130)

    @property
    def peak_mb(self) -> float:
        return max((s[1] for s in self.samples), default=0) / 1e6


def default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_measured(
    name: str,
    command: list[str],
    log: Path,
    env: dict[str, str] | None = None,
    marker: str | None = None,
    interrupt_after: float | None = None,
) -> Result:
    """Run `command`, sampling its tree's PSS; stdout and stderr go to `log` (and are scanned for `marker`).

    After `interrupt_after` seconds the command gets SIGINT (train.py then stops at the end of
    its step, checkpoints and exits with status 130, which counts as success here).
    """
    result = Result(name, command, log)
    full_env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    print(f"[data bench] {name}: {' '.join(command)}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8", errors="replace") as log_file:
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            cwd=REPO,
            text=True,
            errors="replace",
            # A job started in the background (nohup ... &) ignores SIGINT, and so would its
            # children: the command gets the default handler back, or our SIGINT would not stop it.
            preexec_fn=default_sigint,
        )
        sampler = TreeMemorySampler(proc.pid).start()

        def read_output() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if marker and result.marker_s is None and line.startswith(marker):
                    result.marker_s = time.perf_counter() - start
                log_file.write(line)
                result.stdout_tail = (result.stdout_tail + [line.rstrip("\n")])[-20:]

        reader = threading.Thread(target=read_output, daemon=True)
        reader.start()
        try:
            result.returncode = proc.wait(timeout=interrupt_after)
        except subprocess.TimeoutExpired:
            result.interrupted = True
            proc.send_signal(signal.SIGINT)
            result.returncode = proc.wait()
        result.wall_s = time.perf_counter() - start
        sampler.stop()
        reader.join()
    result.samples = sampler.samples
    with open(log.with_suffix(".pss.tsv"), "w") as series:  # the whole series, beside the log
        series.write("seconds\tpss_mb\tprocesses\n")
        series.writelines(f"{t:.3f}\t{pss / 1e6:.1f}\t{n}\n" for t, pss, n in sampler.samples)
    status = "ok" if result.ok else f"FAILED (exit {result.returncode}, log {log})"
    print(
        f"[data bench] {name}: {status}, {result.wall_s:.2f} s, peak PSS {result.peak_mb:.0f} MB",
        file=sys.stderr,
        flush=True,
    )
    if not result.ok:
        print("\n".join(result.stdout_tail), file=sys.stderr)
    return result


# ------------------------------------------------------------------------------------------------
# Corpora


def parse_size(text: str) -> int:
    """'100MB' -> 100_000_000 (decimal units: KB, MB, GB; a bare number is bytes)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMG]?B?)\s*", text.upper())
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 100MB, 1GB)")
    scale = {"": 1, "B": 1, "K": 1e3, "KB": 1e3, "M": 1e6, "MB": 1e6, "G": 1e9, "GB": 1e9}[match.group(2)]
    return int(float(match.group(1)) * scale)


def size_label(size: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if size >= scale and size % (scale // 10) == 0:
            value = size / scale
            return f"{value:g}{unit}"
    return f"{size}B"


def shakespeare_lines() -> list[str]:
    from minitx.data.sources import shakespeare_text

    train, val = shakespeare_text()
    return [line for line in (train + val).splitlines(keepends=True) if line.strip()]


def make_corpus(path: Path, size: int, seed: int = SEED, lines: Sequence[str] | None = None) -> Path:
    """Write shuffled Shakespeare lines to `path` until it holds at least `size` bytes (reused if there).

    Streams: one shuffled copy of the lines (about 5 MB) is held at a time. Written under a
    temporary name and renamed, so a file under the final name is always complete.
    """
    if path.exists():
        return path
    lines = list(shakespeare_lines() if lines is None else lines)
    encoded = [line.encode("utf-8") for line in lines]
    rng = random.Random(seed)
    written = 0
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb", buffering=1 << 20) as out:
        while written < size:
            rng.shuffle(encoded)
            block = b"".join(encoded)
            if written + len(block) > size:  # the last block: whole lines up to the size
                cut = block.find(b"\n", size - written - 1)
                block = block if cut < 0 else block[: cut + 1]
            out.write(block)
            written += len(block)
    os.replace(tmp, path)
    return path


# ------------------------------------------------------------------------------------------------
# The commands

BASELINE_PROGRAM = r'''
"""tokenizers' own byte-level BPE, trained and applied as minitx's train_bpe sets it up."""
import json, sys, time
import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

path, vocab_size, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
PIECE_BYTES = 1 << 20   # lines read per piece
ITEM_BYTES = 1 << 13    # lines joined into one encode_batch item

def pieces():
    with open(path, encoding="utf-8") as corpus:
        while True:
            lines = corpus.readlines(PIECE_BYTES)
            if not lines:
                return
            yield lines

def items(lines):
    group, size = [], 0
    for line in lines:
        group.append(line)
        size += len(line)
        if size >= ITEM_BYTES:
            yield "".join(group)
            group, size = [], 0
    if group:
        yield "".join(group)

t0 = time.perf_counter()
tokenizer = Tokenizer(models.BPE())
tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tokenizer.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=vocab_size,
    special_tokens=["<|endoftext|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
)
tokenizer.train_from_iterator(pieces(), trainer)
t1 = time.perf_counter()
count = 0
with open(out_path, "wb") as out:
    for lines in pieces():
        encodings = tokenizer.encode_batch(list(items(lines)), add_special_tokens=False)
        ids = np.concatenate([np.asarray(e.ids, dtype=np.uint16) for e in encodings])
        ids.tofile(out)
        count += ids.size
t2 = time.perf_counter()
print(json.dumps({"train_s": t1 - t0, "encode_s": t2 - t1, "tokens": count,
                  "vocab": tokenizer.get_vocab_size()}))
'''

# A model small enough that one step is negligible next to the start.
START_MODEL = [
    "--model.n_layer", "1", "--model.n_head", "2", "--model.d_model", "32", "--model.block_size", "64",
    "--data.batch_size", "4", "--data.val_batches", "1", "--trainer.limit_val_batches", "1",
]  # fmt: skip
COMMON_TRAIN = [
    "--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false", "--run.sample_tokens", "0",
]  # fmt: skip


@dataclass
class Bench:
    work: Path
    threads: int
    vocab_size: int
    train_flags: set[str]
    has_prepare: bool
    runs: int = 0

    def data_flags(self, corpus: Path | None, tokenizer: str, cache: Path) -> list[str]:
        flags = ["--data.cache_dir", str(cache)]
        if corpus is not None:
            flags += [
                "--data.source",
                "files",
                "--data.train_files",
                str(corpus),
                "--data.val_fraction",
                "0.01",
            ]
            flags += ["--data.tokenizer", tokenizer]
            if tokenizer == "bpe":
                # the BPE target; minitx before 0.2 called it data.vocab_size
                key = (
                    "--data.bpe_vocab_size"
                    if "--data.bpe_vocab_size" in self.train_flags
                    else "--data.vocab_size"
                )
                flags += [key, str(self.vocab_size)]
                if "--data.tokenizer_train_bytes" in self.train_flags:  # the baseline trains on all of it
                    flags += ["--data.tokenizer_train_bytes", str(corpus.stat().st_size)]
        if "--data.num_proc" in self.train_flags:
            flags += ["--data.num_proc", str(self.threads)]
        return flags

    def run_flags(self) -> list[str]:
        self.runs += 1
        return ["--run.root", str(self.work / "runs"), "--run.name", f"run{self.runs}"]

    def log(self, name: str) -> Path:
        (self.work / "logs").mkdir(exist_ok=True)
        return self.work / "logs" / (re.sub(r"[^A-Za-z0-9.]+", "-", name) + ".log")

    def prepare(self, name: str, corpus: Path | None, tokenizer: str, cache: Path) -> Result:
        shutil.rmtree(cache, ignore_errors=True)  # prepare from nothing
        data = self.data_flags(corpus, tokenizer, cache)
        if self.has_prepare:
            command = [sys.executable, str(REPO / "prepare.py"), *data]
        else:  # before prepare.py: the first train run prepares
            command = [sys.executable, str(REPO / "train.py"), *data, *START_MODEL, *COMMON_TRAIN]
            command += ["--trainer.max_steps", "1", *self.run_flags()]
        return run_measured(name, command, self.log(name))

    def train(
        self,
        name: str,
        corpus: Path | None,
        tokenizer: str,
        cache: Path,
        extra: list[str],
        seconds: float | None = None,
    ) -> Result:
        command = [sys.executable, str(REPO / "train.py"), *self.data_flags(corpus, tokenizer, cache)]
        command += [*COMMON_TRAIN, *extra, *self.run_flags()]
        return run_measured(name, command, self.log(name), marker=START_MARKER, interrupt_after=seconds)

    def start(self, name: str, corpus: Path | None, tokenizer: str, cache: Path, repeats: int) -> Result:
        """The fastest of `repeats` one-step runs (a shared machine only makes a run slower)."""
        results = [
            self.train(
                f"{name} #{i + 1}", corpus, tokenizer, cache, [*START_MODEL, "--trainer.max_steps", "1"]
            )
            for i in range(repeats)
        ]
        failed = [r for r in results if not r.ok]
        return failed[0] if failed else min(results, key=lambda r: r.wall_s)

    def long_run(
        self, name: str, corpus: Path, cache: Path, steps: int, block: int, batch: int, seconds: float
    ) -> Result:
        """`steps` steps (or `seconds`) of `batch` random windows of `block` tokens: does memory grow as more is read?"""
        extra = [
            "--model.n_layer", "1", "--model.n_head", "2", "--model.d_model", "32",
            "--model.block_size", str(block), "--data.batch_size", str(batch),
            "--data.val_batches", "1", "--trainer.limit_val_batches", "1",
            "--trainer.max_steps", str(steps), "--trainer.val_check_interval", str(steps),
            "--run.checkpoint_every_n_steps", str(steps),
        ]  # fmt: skip
        return self.train(name, corpus, "char", cache, extra, seconds)

    def baseline(self, name: str, corpus: Path) -> tuple[Result, dict]:
        program = self.work / "bpe_baseline.py"
        program.write_text(BASELINE_PROGRAM)
        out = self.work / "baseline-ids.uint16"
        env = dict(os.environ, RAYON_NUM_THREADS=str(self.threads), TOKENIZERS_PARALLELISM="true")
        command = [sys.executable, str(program), str(corpus), str(self.vocab_size), str(out)]
        result = run_measured(name, command, self.log(name), env=env)
        out.unlink(missing_ok=True)
        info: dict = {}
        for line in reversed(result.stdout_tail):
            if line.startswith("{"):
                info = json.loads(line)
                break
        return result, info


def supported_train_flags() -> set[str]:
    """The `--data.*` flags train.py knows now (the data pipeline is changing under this script)."""
    help_text = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "--help"], capture_output=True, text=True, cwd=REPO
    ).stdout
    return set(re.findall(r"--data\.[a-z_]+", help_text))


# ------------------------------------------------------------------------------------------------
# Tables


def yes_no(condition: bool) -> str:
    return "yes" if condition else "no"


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], right_from: int = 3) -> str:
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def steps_done(result: Result) -> int | None:
    """The step a train.py run ended at, from its last lines ("... at step N")."""
    for line in reversed(result.stdout_tail):
        match = re.search(r"at step (\d+)", line)
        if match:
            return int(match.group(1))
    return None


def pages_touched(corpus_chars: int, windows: int, block_size: int, itemsize: int = 2) -> float:
    """Expected share of the 4 KB pages of a char corpus's shards that `windows` random windows read."""
    pages = max(1.0, corpus_chars * itemsize / 4096)
    pages_per_window = 1 + (block_size + 1) * itemsize / 4096
    return 1 - math.exp(-windows * pages_per_window / pages)


def training_phase(result: Result) -> list[tuple[float, int, int]]:
    """The samples from the start of fit (the marker line) on; all of them if it never printed."""
    begin = result.marker_s or 0.0
    phase = [s for s in result.samples if s[0] >= begin]
    return phase or result.samples


def memory_growth_mb(result: Result) -> float:
    """How far PSS rose after the first tenth of training (warm-up: the first steps' allocations)."""
    phase = training_phase(result)
    settled = phase[len(phase) // 10 :]
    if len(settled) < 2:
        return 0.0
    return (max(s[1] for s in settled) - settled[0][1]) / 1e6


def is_flat(result: Result) -> bool:
    phase = training_phase(result)
    settled_mb = phase[len(phase) // 10][1] / 1e6 if phase else 0.0
    return memory_growth_mb(result) <= max(FLAT_GROWTH_MB, 0.1 * settled_mb)


# ------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes", nargs="+", type=parse_size, default=None, help="corpus sizes (100MB 1GB 4GB)"
    )
    parser.add_argument("--tokenizers", nargs="+", choices=("char", "bpe"), default=["char", "bpe"])
    parser.add_argument(
        "--bpe-sizes", nargs="+", type=parse_size, default=None, help="sizes BPE runs at (100MB)"
    )
    parser.add_argument(
        "--train-sizes", nargs="+", type=parse_size, default=None, help="sizes of the long run (1GB)"
    )
    parser.add_argument("--work", type=Path, default=None, help="work directory (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (corpora, caches, logs)")
    parser.add_argument("--tiny", action="store_true", help="a 1 MB corpus, every step once: a smoke test")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="cores to use")
    parser.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary, both sides")
    parser.add_argument("--start-repeats", type=int, default=2, help="start runs per corpus, fastest kept")
    parser.add_argument("--train-steps", type=int, default=2000, help="most steps of the long run")
    parser.add_argument(
        "--train-seconds", type=float, default=180, help="long run: stopped (SIGINT) after this long"
    )
    parser.add_argument("--train-batch-size", type=int, default=256, help="long run: windows per step")
    parser.add_argument("--train-block-size", type=int, default=64, help="long run: tokens per window")
    args = parser.parse_args(argv)

    if args.tiny:
        sizes = args.sizes or [parse_size("1MB")]
        bpe_sizes, train_sizes = args.bpe_sizes or sizes[:1], args.train_sizes or sizes[:1]
        args.start_repeats, args.train_steps, args.vocab_size = 1, 10, min(args.vocab_size, 512)
    else:
        sizes = args.sizes or [parse_size(s) for s in ("100MB", "1GB", "4GB")]
        bpe_sizes = args.bpe_sizes or [parse_size("100MB")]
        train_sizes = args.train_sizes or [parse_size("1GB")]
    sizes = sorted(set(sizes))

    temporary = args.work is None
    work = Path(tempfile.mkdtemp(prefix="minitx-data-bench-")) if temporary else args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    has_prepare = (REPO / "prepare.py").exists()
    if not has_prepare:
        print(
            "[data bench] prepare.py not found in the repository: prepare is measured as the first "
            "one-step train.py run (which prepares the data), marked 'prepare (train.py)' in the table",
            file=sys.stderr,
        )
    needed = sum(s for s in sizes if not (work / f"corpus-{size_label(s)}.txt").exists()) + 2.2 * max(sizes)
    free = shutil.disk_usage(work).free
    if free < needed:
        print(
            f"[data bench] warning: {free / 1e9:.1f} GB free under {work}, about {needed / 1e9:.1f} GB needed",
            file=sys.stderr,
        )
    bench = Bench(work, args.threads, args.vocab_size, supported_train_flags(), has_prepare)
    prepare_step = "prepare" if has_prepare else "prepare (train.py)"
    rows: list[list[str]] = []
    bpe_rows: list[list[str]] = []
    start_rows: list[list[str]] = []
    memory_rows: list[list[str]] = []
    failures = 0

    def add_row(corpus: str, tokenizer: str, step: str, result: Result, mb: float | None, met: bool) -> None:
        nonlocal failures
        failures += not result.ok
        mb_per_s = None if mb is None or not result.ok else mb / result.wall_s
        rows.append(
            [
                corpus,
                tokenizer,
                step,
                fmt(result.wall_s),
                fmt(mb_per_s, 1),
                f"{result.peak_mb:.0f}",
                yes_no(met and result.ok) if result.ok else f"failed (exit {result.returncode})",
            ]
        )

    try:
        # The reference start: the default source, prepared first.
        cache = work / "cache-shakespeare"
        result = bench.prepare("shakespeare char prepare", None, "char", cache)
        add_row("shakespeare", "char", prepare_step, result, None, result.peak_mb <= PEAK_PSS_TARGET_MB)
        reference = bench.start("shakespeare char start", None, "char", cache, args.start_repeats)
        add_row("shakespeare", "char", "start", reference, None, reference.peak_mb <= PEAK_PSS_TARGET_MB)
        shutil.rmtree(cache, ignore_errors=True)
        largest_start: tuple[str, Result] | None = None

        for size in sizes:
            label = size_label(size)
            print(f"[data bench] corpus {label} ...", file=sys.stderr, flush=True)
            corpus = make_corpus(work / f"corpus-{label}.txt", size)
            mb = corpus.stat().st_size / 1e6
            for tokenizer in args.tokenizers:
                if tokenizer == "bpe" and size not in bpe_sizes:
                    continue
                name = f"{label} {tokenizer}"
                cache = work / f"cache-{label}-{tokenizer}"
                prep = bench.prepare(f"{name} prepare", corpus, tokenizer, cache)
                met = prep.peak_mb <= PEAK_PSS_TARGET_MB
                if tokenizer == "char":
                    met = met and mb / prep.wall_s >= CHAR_MB_PER_S_TARGET
                else:
                    base, info = bench.baseline(f"{name} tokenizers baseline", corpus)
                    ratio = prep.wall_s / base.wall_s if prep.ok and base.ok else None
                    met = met and ratio is not None and ratio <= BPE_RATIO_TARGET
                    failures += not base.ok
                    bpe_rows.append(
                        [
                            label,
                            fmt(prep.wall_s),
                            fmt(base.wall_s),
                            f"{fmt(info.get('train_s'))} + {fmt(info.get('encode_s'))}",
                            fmt(ratio),
                            f"{prep.peak_mb:.0f}",
                            f"{base.peak_mb:.0f}",
                            yes_no(ratio is not None and ratio <= BPE_RATIO_TARGET),
                        ]
                    )
                add_row(label, tokenizer, prepare_step, prep, mb, met)
                if not prep.ok:
                    continue
                start = bench.start(f"{name} start", corpus, tokenizer, cache, args.start_repeats)
                add_row(label, tokenizer, "start", start, None, start.peak_mb <= PEAK_PSS_TARGET_MB)
                if tokenizer == "char":
                    largest_start = (label, start)
                if size in train_sizes and tokenizer == "char":
                    block, batch = args.train_block_size, args.train_batch_size
                    steps = max(1, min(args.train_steps, -(-size // (block * batch))))
                    train = bench.long_run(
                        f"{name} train", corpus, cache, steps, block, batch, args.train_seconds
                    )
                    steps = steps_done(train) or steps
                    flat = train.ok and is_flat(train)
                    add_row(
                        label, tokenizer, "train", train, None, train.peak_mb <= PEAK_PSS_TARGET_MB and flat
                    )
                    phase = training_phase(train)
                    if phase:
                        drawn = steps * block * batch
                        memory_rows.append(
                            [
                                label,
                                str(steps),
                                f"{drawn / 1e6:.1f}M ({100 * drawn / size:.0f}%)",
                                f"{100 * pages_touched(size, steps * batch, block):.0f}%",
                                f"{phase[0][1] / 1e6:.0f}",
                                f"{phase[len(phase) // 2][1] / 1e6:.0f}",
                                f"{phase[-1][1] / 1e6:.0f}",
                                f"{train.peak_mb:.0f}",
                                f"{memory_growth_mb(train):+.0f}",
                                yes_no(flat),
                            ]
                        )
                if not args.keep:
                    shutil.rmtree(cache, ignore_errors=True)

        if largest_start is not None and reference.ok:
            label, start = largest_start
            diff = start.wall_s - reference.wall_s
            marker_diff = (
                start.marker_s - reference.marker_s
                if start.marker_s is not None and reference.marker_s is not None
                else None
            )
            start_rows = [
                [
                    "shakespeare",
                    fmt(reference.wall_s),
                    fmt(reference.marker_s),
                    f"{reference.peak_mb:.0f}",
                    "",
                    "",
                ],
                [f"{label} char", fmt(start.wall_s), fmt(start.marker_s), f"{start.peak_mb:.0f}", "", ""],
                [
                    f"{label} - shakespeare",
                    f"{diff:+.2f}",
                    "-" if marker_diff is None else f"{marker_diff:+.2f}",
                    f"{start.peak_mb - reference.peak_mb:+.0f}",
                    f"{start.wall_s / reference.wall_s:.2f}x",
                    yes_no(diff <= START_DIFF_TARGET_S and start.peak_mb <= PEAK_PSS_TARGET_MB),
                ],
            ]
    finally:
        if not args.keep:
            for path in work.glob("cache-*"):
                shutil.rmtree(path, ignore_errors=True)
            shutil.rmtree(work / "runs", ignore_errors=True)
            if temporary and not failures:
                shutil.rmtree(work, ignore_errors=True)
            elif temporary:  # the logs of what failed stay; the corpora go
                for path in work.glob("corpus-*"):
                    path.unlink()

    print(
        f"## Data pipeline: {args.threads} cores, {os.uname().machine}, PSS of the process tree every 50 ms\n"
    )
    header = ["corpus", "tokenizer", "step", "wall s", "MB/s", "peak PSS MB", "target met"]
    print(table(header, rows))
    print(
        f"\nTargets: peak PSS <= {PEAK_PSS_TARGET_MB:.0f} MB everywhere; char prepare >= "
        f"{CHAR_MB_PER_S_TARGET:.0f} MB/s; bpe prepare <= {BPE_RATIO_TARGET}x the tokenizers baseline; "
        f"train: PSS flat (its max no more than {FLAT_GROWTH_MB:.0f} MB or 10% above its value a tenth into fit)."
    )
    if bpe_rows:
        print(
            f"\n### BPE prepare against the tokenizers library (vocab {args.vocab_size}, {args.threads} threads)\n"
        )
        header = ["corpus", "minitx prepare s", "tokenizers s", "(train + encode s)", "ratio"]
        header += ["minitx peak PSS MB", "tokenizers peak PSS MB", f"ratio <= {BPE_RATIO_TARGET}"]
        print(table(header, bpe_rows, right_from=1))
    if start_rows:
        print("\n### Start to the first step: one-step train.py runs, fastest of", args.start_repeats, "\n")
        header = ["data", "wall s", f"to '{START_MARKER}' s", "peak PSS MB", "ratio", "within 1 s"]
        print(table(header, start_rows, right_from=1))
    if memory_rows:
        print(
            f"\n### Memory over a long run (block {args.train_block_size} x batch {args.train_batch_size}; "
            "PSS MB from the start of fit; pages read: the expected share of the token shards' 4 KB "
            "pages that the random windows touch)\n"
        )
        header = [
            "corpus",
            "steps",
            "tokens drawn (of corpus)",
            "pages read",
            "first",
            "middle",
            "last",
            "max",
        ]
        header += ["growth MB", "flat"]
        print(table(header, memory_rows, right_from=1))
    if not has_prepare:
        print("\nprepare.py was not in the repository: 'prepare (train.py)' is a one-step train.py run.")
    if failures:
        print(f"\n{failures} command(s) failed; their logs are in {work / 'logs'}.")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
