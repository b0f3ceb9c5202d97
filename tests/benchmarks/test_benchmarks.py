"""The benchmark scripts run end to end and print their tables (at toy sizes: nothing is timed here).

Speed is measured by running the scripts themselves (benchmarks/RESULTS.md); these tests only
keep them from rotting as the code they measure changes.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WORDS = "the quick brown fox jumps over a lazy dog while seven kings sing of old stars".split()


def run_script(name: str, *args: str, cwd: Path) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / name), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def table_rows(text: str, first_cell: str) -> list[list[str]]:
    """Cells of the Markdown table rows whose first cell starts with first_cell."""
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("|")
    ]
    return [row for row in rows if row[0].startswith(first_cell)]


@pytest.mark.slow  # a benchmark script end to end: 3-5 s
def test_attention_benchmark_times_every_variant(tmp_path):
    out = run_script(
        "attention.py",
        "--seq-lens",
        "8",
        "20",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--d-model",
        "32",
        "--n-head",
        "2",
        "--window",
        "4",
        "--threads",
        "1",
        "--cpu-time",
        cwd=tmp_path,
    )
    assert "thread CPU time" in out
    for variant in ("mha", "mqa", "gqa", "local", "local-dense", "mta", "mta-full"):
        rows = [row for row in table_rows(out, variant) if row[0] == variant]
        assert [row[1] for row in rows] == ["8", "20"], (variant, rows)
        assert all(float(cell) >= 0 for row in rows for cell in row[2:5])  # ms, peak MiB, saved MiB parse
    assert table_rows(out, "dense-mask local / chunked local time")


def test_attention_benchmark_adds_the_triton_rows_on_cuda_only():
    import argparse
    import importlib.util

    from minitx.attention.mta import triton_launch as mta_triton

    spec = importlib.util.spec_from_file_location("attention_benchmark", REPO / "benchmarks" / "attention.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for device in ("cpu", "cuda"):
        args = argparse.Namespace(device=device, window=4, n_head=2, seq_lens=[8, 1024])
        all_variants = bench.variants(args)
        assert set(bench.TRITON_VARIANTS) <= set(all_variants)  # --variants may always name them
        defaults = bench.default_variants(args, all_variants)
        assert (set(bench.TRITON_VARIANTS) <= set(defaults)) == (device == "cuda" and mta_triton.available())
        assert set(defaults) - set(bench.TRITON_VARIANTS) == set(all_variants) - set(bench.TRITON_VARIANTS)
        # mta and mta-both: auto on the CPU; on CUDA (where auto takes triton) the torch path auto took before
        for name in ("mta", "mta-both"):
            backends = [
                bench.resolved(all_variants[name], T)["options"]["mta"].get("backend", "auto")
                for T in (8, 1024)
            ]
            assert backends == (["auto", "auto"] if device == "cpu" else ["conv", "factorised"]), (
                device,
                name,
            )
        for name in bench.TRITON_VARIANTS:
            assert all_variants[name]["options"]["mta"]["backend"] == "triton"


@pytest.mark.slow
def test_generate_benchmark_prints_speed_and_memory(tmp_path):
    out = run_script(
        "generate.py",
        "--new-tokens",
        "4",
        "--repeats",
        "1",
        "--kinds",
        "mha",
        "local (window 64)",
        "--contexts",
        "16",
        "--compile",
        cwd=tmp_path,
    )
    speed_text, memory_text = out.split("### KV cache memory")
    speed_text, step_text = speed_text.split("### One cached model step")
    speed_text, compiled_text = speed_text.split("### Cached decoding compiled")
    compiled = {row[0]: row for row in table_rows(compiled_text, "")[2:]}
    assert set(compiled) == {"mha", "local (window 64)"}  # the kinds, not the extra contexts
    assert all(
        float(row[1].replace(",", "")) > 0 and re.fullmatch(r"[\d.]+x", row[3]) for row in compiled.values()
    )
    steps = {row[0]: row for row in table_rows(step_text, "")[2:]}
    assert set(steps) == {"mha, d_model 128", "local (window 64), d_model 128", "mha, d_model 8"}
    assert all(float(ms) > 0 for row in steps.values() for ms in row[1:])
    speed = {row[0]: row for row in table_rows(speed_text, "")[2:]}  # after the header and the rule
    assert set(speed) == {"mha", "local (window 64)", "mha, block_size 16"}
    assert all(re.fullmatch(r"[\d.]+x", row[3]) for row in speed.values())  # the speed-up column
    memory = {row[0]: row for row in table_rows(memory_text, "")[2:]}
    assert (
        float(memory["mqa"][-1]) == 0.25 and float(memory["gqa (2 kv heads)"][-1]) == 0.5
    )  # 1/n_head, n_kv_head/n_head
    assert len(set(memory["local (window 64)"][1:5])) == 1  # flat in length


@pytest.mark.slow  # a benchmark script end to end: 3-5 s
def test_mta_kernels_benchmark_times_the_c_loops_against_torch(tmp_path):
    from minitx.attention.mta import native

    if native.library() is None:
        pytest.skip("the C loops could not be built here")
    out = run_script("mta_kernels.py", "--keys", "7", "40", "--rows", "9", "--repeats", "1", cwd=tmp_path)
    rows = table_rows(out, "")[2:]
    assert [row[0] for row in rows] == ["7"] * 4 + ["40"] * 4  # three kernels and training's one pass
    assert any("training's one pass" in row[1] for row in rows)
    assert all(float(row[2]) > 0 and float(row[3]) > 0 for row in rows) and all(row[5] for row in rows[::4])


def tiny_files_config(tmp_path) -> None:
    """tmp_path/tiny.yaml: a one-layer model on a few hundred lines of random words, so a
    training benchmark runs its steps in seconds."""
    rng = random.Random(0)
    for name, lines in (("train.txt", 400), ("val.txt", 80)):
        (tmp_path / name).write_text(
            "".join(" ".join(rng.choices(WORDS, k=rng.randint(3, 9))) + ".\n" for _ in range(lines))
        )
    config = {
        "model": {"n_layer": 1, "n_head": 2, "d_model": 32, "block_size": 32},
        "data": {
            "source": "files",
            "train_files": str(tmp_path / "train.txt"),
            "val_files": str(tmp_path / "val.txt"),
            "batch_size": 4,
            "cache_dir": str(tmp_path / "cache"),
        },
    }
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(config))


@pytest.mark.slow
def test_train_throughput_benchmark_compares_the_loops(tmp_path):
    tiny_files_config(tmp_path)
    out = run_script(
        "train_throughput.py",
        "--config",
        str(tmp_path / "tiny.yaml"),
        "--rounds",
        "1",
        "--steps",
        "4",
        "--skip",
        "1",
        cwd=tmp_path,
    )
    ratio = re.search(r"ratio ([\d.]+)", out)
    assert ratio and float(ratio.group(1)) > 0, out[-1000:]


@pytest.mark.slow
def test_nanogpt_recipe_benchmark_times_both_sides_with_their_losses(tmp_path):
    """Both sides train 12 steps of the recipe, one round; each prints its times, the table and
    the ratio, with the digest of its per-step losses (StepClock records minitx's)."""
    out = run_script("nanogpt_recipe.py", "--iters", "12", "--rounds", "1", "--skip", "2", cwd=tmp_path)
    rows = {row[0]: row for row in table_rows(out, "minitx") + table_rows(out, "reference")}
    assert set(rows) == {"minitx", "reference"}, out[-2000:]
    for row in rows.values():
        assert float(row[1]) > 0 and float(row[6]) > 0  # ms a step, wall
        assert 1.0 < float(row[11]) < 6.0  # a val loss after 12 steps from ln(76) = 4.3
        assert re.fullmatch(r"[0-9a-f]{12}", row[12]) and float(row[9]) > 0 and float(row[10]) > 0
    assert re.search(r"minitx / reference: [\d.]+ in ms a step, [\d.]+ in wall", out), out[-1000:]


@pytest.mark.slow
def test_mfu_benchmark_prints_peak_ratio_and_profile(tmp_path):
    tiny_files_config(tmp_path)
    args = ("--steps", "4", "--skip", "1", "--size", "64", "--repeats", "2", "--profile-steps", "1")
    out = run_script("mfu.py", "--config", str(tmp_path / "tiny.yaml"), *args, cwd=tmp_path)
    assert re.search(r"peak: [\d.]+ GFLOP/s \(float32 64 x 64 matmul", out), out[-1000:]
    assert re.search(r"MFU: [\d.]+% of the measured float32 matmul peak", out), out[-1000:]
    assert re.search(r"executed FLOPs .* MFLOP/token, [\d.]+ GFLOP/s; HFU: [\d.]+%", out), out[-1000:]
    assert "forward" in out and "backward" in out and "aten::mm" in out  # the profile, by phase and operator


@pytest.mark.slow  # a benchmark script end to end: 3-5 s
def test_prefill_benchmark_prints_a_row_per_kind_and_prompt(tmp_path):
    out = run_script(
        "prefill.py",
        "--prompt-blocks",
        "1",
        "3",
        "--block-size",
        "16",
        "--d-model",
        "32",
        "--n-layer",
        "2",
        "--repeats",
        "1",
        cwd=tmp_path,
    )
    for kind in ("mha", "local", "mta"):
        assert [row[1] for row in table_rows(out, kind)] == ["16", "48"], out


@pytest.mark.slow
def test_sdpa_widths_prints_every_width_pair(tmp_path):
    out = run_script("sdpa_widths.py", "--batch", "1", "--seq-len", "16", "--repeats", "1", cwd=tmp_path)
    rows = [row for row in table_rows(out, "") if row[0].isdigit()]
    assert [(int(row[0]), int(row[1])) for row in rows] == [
        (32, 32),
        (40, 32),
        (40, 40),
        (48, 32),
        (48, 48),
        (32, 64),
        (64, 64),
    ]
    assert rows[0][3] == "1.00" and all(float(row[2]) > 0 for row in rows)


@pytest.mark.slow  # a benchmark script end to end: 3-5 s
def test_diff_attention_benchmark_prints_every_way_at_every_length(tmp_path):
    out = run_script(
        "diff_attention.py", "--seq-lens", "1", "70", "--batch", "2", "--repeats", "1", cwd=tmp_path
    )
    rows = [row for row in table_rows(out, "") if row[0].isdigit()]
    assert [row[0] for row in rows] == ["1", "70"]
    assert all(len(row) == 9 and row[2] == "1.00" and float(row[7]) > 0 for row in rows)


@pytest.mark.slow
def test_diff_attention_benchmark_times_whole_steps(tmp_path):
    out = run_script(
        "diff_attention.py", "--step", "--seq-lens", "9", "--batch", "1", "--repeats", "1", cwd=tmp_path
    )
    (row,) = [row for row in table_rows(out, "") if row[0].isdigit()]
    assert row[0] == "9" and len(row) == 14 and row[2] == row[4] == "1.00"


@pytest.mark.slow
def test_memory_benchmark_prints_both_rows_of_each_kind(tmp_path):
    out = run_script(
        "memory.py",
        "--seq-len",
        "512",
        "--kinds",
        "mha",
        "mta",
        "--repeats",
        "1",
        "--warmup",
        "1",
        cwd=tmp_path,
    )
    for kind in ("mha", "mta"):
        off, on = table_rows(out, kind)[:2]
        assert off[1] == "off" and on[1] == "on", out
        assert float(on[3].replace(",", "")) < float(off[3].replace(",", "")), out  # checkpointing keeps less


@pytest.mark.slow  # a benchmark script end to end: 3-5 s
def test_startup_benchmark_prints_its_table(tmp_path):
    out = run_script("startup.py", "--rounds", "1", "--only", "import minitx", cwd=tmp_path)
    rows = {row[0]: row[1:] for row in table_rows(out, "import")}
    assert set(rows) == {"import torch", "import minitx"}
    assert re.match(r"[+-]\d+\.\d\d", rows["import minitx"][0]) and rows["import minitx"][1] == "+0.3"


def test_memory_benchmark_growth_is_the_exponent_of_t(monkeypatch):
    """memory.py --seq-lens: peak ~ T^exponent between consecutive lengths (1 linear, 2 quadratic)."""
    import importlib.util

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # memory.py imports attention.py beside it
    spec = importlib.util.spec_from_file_location("memory_benchmark", REPO / "benchmarks" / "memory.py")
    memory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(memory)
    assert memory.growth([10.0, 20.0, 80.0], [1024, 2048, 4096]) == "1.00, 2.00"
    assert memory.growth([10.0, None, 40.0], [1, 2, 4]) == "-, -"


@pytest.mark.slow  # times Newton-Schulz at the benchmark's sizes: about 11 s
def test_newton_schulz_table_times_and_checks_both_precisions(tmp_path):
    # optimizers.py --newton-schulz: a row per stack of the default model's Muon matrices, float32
    # against float64 at float32's rounding and bfloat16 at bfloat16's, with the two times.
    out = run_script("optimizers.py", "--newton-schulz", cwd=tmp_path)
    rows = {row[0]: row for row in table_rows(out, "")[2:]}
    assert set(rows) == {"4 x 384 x 128", "4 x 128 x 128", "4 x 512 x 128", "4 x 128 x 512", "all"}
    for name, row in rows.items():
        assert float(row[1]) > 0 and float(row[2]) > 0, name
        if name != "all":
            for cell in row[4:6]:
                float32, bfloat16 = (float(x) for x in cell.split(" / "))
                assert float32 < 1e-5 < 1e-4 < bfloat16 < 0.2, (name, cell)


@pytest.mark.slow  # a benchmark script end to end: about 5 s
def test_float32_rounding_benchmark_measures_each_kind_against_float64(tmp_path):
    out = run_script("float32_rounding.py", "--seeds", "2", "--kinds", "mha", "gdn", cwd=tmp_path)
    rows = {row[0]: row for row in table_rows(out, "") if row[0] in ("mha", "gdn")}
    assert set(rows) == {"mha", "gdn"}
    for row in rows.values():
        median, largest = float(row[1]), float(row[3].split()[0])
        assert 0 < median <= largest < 1e-3  # rounding: never exact, nor near a wrong graph's error
