"""What ablate itself prints while runs go in parallel, and what results.md says they were given."""

from __future__ import annotations

import threading
import time

from minitx.ablation import Sweep, Variant
from minitx.ablation.plan.commands import make_run
from minitx.ablation.runs.runner import RUN_FILE, given_arguments, whole_lines
from minitx.files.atomic import write_json_atomically


def test_parallel_runs_print_whole_lines_that_name_their_run():
    written: list[str] = []

    def log_in_two_writes(line: str) -> None:  # as print() does: the text, then its newline
        written.append(line)
        time.sleep(0.001)
        written.append("\n")

    log = whole_lines(log_in_two_writes)
    threads = [
        threading.Thread(target=lambda n=n: [log(f"ablate: ok     run{n} ({i})") for i in range(20)])
        for n in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = "".join(written).splitlines()
    assert len(lines) == 120
    assert all(line.startswith("ablate: ok     run") and line.endswith(")") for line in lines)


def test_results_name_the_training_arguments_the_runs_were_given(tmp_path):
    sweep = Sweep(base_text="{}\n", overrides={}, variants=[Variant("mha", {}), Variant("mqa", {})])
    extra = ["--trainer.max_steps", "50", "--data.batch_size", "4"]
    runs = [make_run(sweep, variant, 1337, tmp_path, extra) for variant in sweep.variants]
    assert given_arguments(runs) == [
        "training arguments given to every run after `--`: `--trainer.max_steps 50 --data.batch_size 4`"
    ]

    # The runs' own records win over this invocation's arguments (a --report-only report).
    plain = [make_run(sweep, variant, 1337, tmp_path) for variant in sweep.variants]
    assert given_arguments(plain) == []
    runs[1].directory.mkdir(parents=True)
    write_json_atomically(runs[1].directory / RUN_FILE, {"command": runs[1].command})
    notes = given_arguments(plain)
    assert notes == [
        "training arguments after `--` for mha seed 1337: `(none)`",
        "training arguments after `--` for mqa seed 1337: `--trainer.max_steps 50 --data.batch_size 4`",
    ]
