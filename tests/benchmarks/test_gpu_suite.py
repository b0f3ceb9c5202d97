"""benchmarks/gpu.py: the GPU suite runs at toy size on the CPU, so it is ready whenever a GPU comes.

The subprocess runs exactly what a GPU slot runs, with --device cpu --tiny; the in-process tests
show that its checks fail on broken attention, and that bad input is one line and exit status 2.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import fla_stand_in

from minitx.attention import local

REPO = Path(__file__).resolve().parents[2]
KINDS = ("mha", "mqa", "gqa", "local", "mta")
# The 2024-25 variants: the suite runs each one whose config file exists and whose kind is registered.
VARIANTS = ("mla", "diff", "qknorm", "sinks", "gated")
LINEAR = ("gdn", "hybrid")  # Gated DeltaNet, and the 3:1 hybrid with gated mha
COMPILED_TRAINING = (*KINDS, "mla", "diff", *LINEAR)


def available(name: str) -> bool:
    from minitx import AttentionConfig

    path = REPO / "configs" / f"{name}.yaml"
    if name in ("mha", "mqa"):
        return True
    if not path.is_file():
        return False
    try:
        AttentionConfig(**yaml.safe_load(path.read_text())["model"]["attention"])
    except ValueError:
        return False
    return True


RUN = tuple(name for name in (*KINDS, *VARIANTS, *LINEAR) if available(name))


def run_suite(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=900,  # the whole rehearsal, every kind and gdn, on two busy CPU cores
    )


@pytest.fixture(scope="module")
def gpu_suite():
    spec = importlib.util.spec_from_file_location("gpu_suite", REPO / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.mark.slow
def test_tiny_cpu_run_passes_every_check_and_writes_the_report(tmp_path):
    out = tmp_path / "out"
    done = run_suite("--device", "cpu", "--tiny", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    assert {"device", "torch", "checks", "measurements"} <= set(report) and report["ok"] is True
    assert report["torch"] == torch.__version__
    for check in report["checks"]:
        assert set(check) >= {"name", "kind", "ok", "detail"} and check["ok"], check
    checked = {(c["name"], c["kind"]) for c in report["checks"]}
    assert {"qknorm", "sinks", "gated"} <= set(RUN)  # options of every softmax kind: always there
    for kind in (*RUN, "mix"):
        assert {(name, kind) for name in ("precision", "causal", "cache", "train step")} <= checked, kind
    assert ("end to end", "mha") in checked
    assert ("muon precision", "mha") in checked  # bf16 Newton-Schulz against float32
    measured = {(m["name"], m["kind"], m.get("compiled")) for m in report["measurements"]}
    for kind in RUN:
        for compiled in (False, True):
            assert (("train tokens/s", kind, compiled) in measured) == (
                not compiled or kind in COMPILED_TRAINING
            ), (kind, compiled)
        assert ("decode speed-up of the cache", kind, None) in measured
        compiled_decoding = ("decode tokens/s with cache, compiled", kind, None) in measured
        assert compiled_decoding == (kind in ("mha", "mta")), kind
    measured_at = {(m["name"], m["kind"], m.get("T")) for m in report["measurements"]}
    for kind in RUN:
        if kind in VARIANTS:  # the variants' attention layer against mha's, at each T
            assert {("attention fwd+bwd / mha", kind, T) for T in (32, 64)} <= measured_at, kind
    goals = {t["name"]: t for t in report["targets"]}
    for kind in VARIANTS:
        label = "compiled" if kind in COMPILED_TRAINING else "eager"
        goal = goals[f"{kind} / mha training tokens/s, {label}"]
        assert goal["target"].startswith(">= 0.77") and (goal["value"] is not None) == (kind in RUN), goal
    for name in (
        "mta / mha decoding tokens/s with cache",
        "mta / mha decoding tokens/s with cache, compiled",
    ):
        assert goals[name]["value"] > 0 and goals[name]["target"] == ">= 0.8", goals[name]
    for m in report["measurements"]:
        assert set(m) >= {"name", "kind", "value", "unit"}
        if m["name"] == "train graph breaks":
            assert m["value"] >= 0, m
        else:
            assert m["value"] is None or m["value"] > 0, m  # MFU is None on a CPU: no peak to divide by
    times = [m for m in report["measurements"] if m["name"] == "attention fwd+bwd"]
    assert {m["T"] for m in times} == {32, 64} and {m["kind"] for m in times} >= {"mha (SDPA)", "local-dense"}
    markdown = (out / "results.md").read_text()
    assert "## Checks: " in markdown and "| causal | mta | yes |" in markdown
    # The Triton work is CUDA only (on the CPU it would run in Triton's interpreter): listed, not run.
    skipped = {(s["name"], s["kind"]) for s in report["skipped"]}
    assert {("triton vs conv", "mta"), ("triton vs conv", "mta (pre only)")} <= skipped
    assert ("sweep devices", "ablate") in skipped  # each sweep run on a GPU of its own: CUDA only
    cuda_only = [s for s in report["skipped"] if s["name"] != "every section"]
    assert all(s["detail"].startswith("skipped: CUDA only") for s in cuda_only)
    # A variant still missing here (its file or its kind) is listed, not silently left out.
    missing = {s["kind"] for s in report["skipped"] if s["name"] == "every section"}
    assert missing == set(VARIANTS + LINEAR) - set(RUN)
    fla_checks = {
        (name, kind)
        for name in ("fla vs torch", "fla vs torch, documents")
        for kind in set(LINEAR) & set(RUN)
    }
    assert fla_checks <= skipped  # fla: CUDA only
    assert not {"mta-triton", "mta-both-triton"} & {m["kind"] for m in report["measurements"]}
    assert "Not run on this device" in markdown


def tiny_config(gpu_suite, kind: str):
    size = gpu_suite.sizes(tiny=True)
    return gpu_suite.model_config(size.model, gpu_suite.attention_sections(size.model["n_layer"], True)[kind])


def test_variants_take_their_config_files_and_the_mix_carries_the_options(gpu_suite):
    size = gpu_suite.sizes(tiny=False)
    sections = gpu_suite.attention_sections(size.model["n_layer"], False)
    assert [name for name in sections if name != "mix"] == list(RUN)
    for name in set(RUN) - {"mha", "mqa"}:
        assert (
            sections[name]
            == yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())["model"]["attention"]
        )
    for name in (*KINDS, *VARIANTS, *LINEAR):
        assert (gpu_suite.unavailable(name) is None) == (name in RUN), name
    # The mix: still the five kinds, now with sinks on local, the gate on gqa and QK-norm on mha.
    config = gpu_suite.model_config(size.model, sections["mix"])
    assert set(config.layer_kinds) == set(KINDS)
    attention = config.attention
    assert attention.options_of("local").sinks and attention.options_of("local").window == 32
    assert attention.options_of("gqa").gate == "elementwise" and attention.options_of("mha").qk_norm
    model = gpu_suite.Transformer(config)
    for block, kind in zip(model.blocks, config.layer_kinds):
        assert (block.attn.sinks is not None) == (kind == "local"), kind
        assert (block.attn.gate_proj is not None) == (kind == "gqa"), kind
    # The attention section times the variants beside mha, and only those asked for.
    rows = gpu_suite.attention_variants(sections, torch.device("cpu"), ["mha", "sinks"])
    assert "sinks" in rows and not {"qknorm", "gated", "mla", "diff"} & set(rows)
    assert set(VARIANTS) & set(RUN) <= set(gpu_suite.attention_variants(sections, torch.device("cpu")))


def test_cuda_attention_rows_keep_the_torch_path_and_add_the_triton_kernels(gpu_suite):
    from minitx import AttentionConfig

    size = gpu_suite.sizes(tiny=False)
    sections = gpu_suite.attention_sections(size.model["n_layer"], False)
    cpu = gpu_suite.attention_variants(sections, torch.device("cpu"))
    assert "mta" in cpu and not set(gpu_suite.TRITON_ROWS) & set(cpu)
    cuda = gpu_suite.attention_variants(sections, torch.device("cuda"))
    backends = {
        name: {T: AttentionConfig(**gpu_suite.attention_bench.resolved(att, T)) for T in size.seq_lens}
        for name, att in cuda.items()
        if name.startswith("mta")
    }
    assert {a.options_of("mta").backend for a in backends["mta (torch)"].values()} == {
        "factorised"
    }  # T > 512
    for name, placement in (("mta-triton", "pre"), ("mta-both-triton", "both")):
        mta = [a.options_of("mta") for a in backends[name].values()]
        assert {(a.backend, a.conv_placement) for a in mta} == {("triton", placement)}


def test_attention_goal_missed_or_not_measured_is_a_failed_check(gpu_suite):
    results = gpu_suite.Results(torch.device("cuda"), tiny=False)
    ms = {"mha (SDPA)": 10.0, "mta-triton": 15.0, "mta-both-triton": 25.0}
    peak = {"mha (SDPA)": 100.0, "mta-triton": 150.0, "mta-both-triton": 180.0}
    gpu_suite.attention_ratios(results, 1024, 16, ms, peak)
    assert not results.checks  # no goal at 1k, ratios only
    gpu_suite.attention_ratios(results, 4096, 4, ms, peak)
    gpu_suite.attention_ratios(results, 16384, 1, {"mha (SDPA)": 10.0}, {"mha (SDPA)": 100.0})
    goals = {(c["kind"], c["detail"].split(",")[0]): c["ok"] for c in results.checks}
    assert goals == {
        ("mta-triton", "T=4096"): True,
        ("mta-both-triton", "T=4096"): False,  # 2.5x
        ("mta-triton", "T=16384"): False,  # not measured
        ("mta-both-triton", "T=16384"): False,
    }
    ratio = gpu_suite.value_of(results.measurements, "attention fwd+bwd / mha", "mta-both-triton", T=4096)
    assert ratio == 2.5


def test_causal_check_fails_when_local_attention_sees_the_next_token(gpu_suite, monkeypatch):
    real_block_mask = local._block_mask

    def peeking_block_mask(n, C, window, n_global, device):
        mask = real_block_mask(n, C, window, n_global, device).clone()
        row = torch.arange(C - 1)
        mask[:, :, row, C + row + 1] = True  # query i also sees key i + 1 within its block
        return mask

    results = gpu_suite.Results(torch.device("cpu"), tiny=True)
    gpu_suite.check_causal(results, "local", tiny_config(gpu_suite, "local"), torch.device("cpu"))
    assert results.checks[-1]["ok"]
    monkeypatch.setattr(local, "_block_mask", peeking_block_mask)
    gpu_suite.check_causal(results, "local", tiny_config(gpu_suite, "local"), torch.device("cpu"))
    assert not results.checks[-1]["ok"], results.checks[-1]


def test_precision_check_fails_when_the_bf16_path_differs(gpu_suite, monkeypatch):
    real_chunked = local.chunked_local

    def wrong_in_bf16(q, k, v, *args, **kwargs):
        out = real_chunked(q, k, v, *args, **kwargs)
        return out.roll(1, dims=2) if q.dtype == torch.bfloat16 else out  # outputs one position late

    monkeypatch.setattr(local, "chunked_local", wrong_in_bf16)
    results = gpu_suite.Results(torch.device("cpu"), tiny=True)
    gpu_suite.check_precision(results, "local", tiny_config(gpu_suite, "local"), torch.device("cpu"))
    assert not results.checks[-1]["ok"], results.checks[-1]


def test_cache_check_fails_when_the_cached_path_is_wrong(gpu_suite, monkeypatch):
    from minitx.attention.softmax import Attention

    real = Attention.attend_cached
    monkeypatch.setattr(
        Attention, "attend_cached", lambda self, q, k, v, cache: real(self, q, k, v, cache) * 0.5
    )
    results = gpu_suite.Results(torch.device("cpu"), tiny=True)
    gpu_suite.check_cache(results, "mha", tiny_config(gpu_suite, "mha"), torch.device("cpu"))
    assert not results.checks[-1]["ok"], results.checks[-1]


@pytest.mark.parametrize("kind", ["mha", "mta"])
def test_documents_check_passes_and_fails_when_attention_crosses_a_document(gpu_suite, monkeypatch, kind):
    config = tiny_config(gpu_suite, kind)
    results = gpu_suite.Results(torch.device("cpu"), tiny=True)
    gpu_suite.check_documents(results, kind, config, torch.device("cpu"))
    assert results.checks[-1]["ok"], results.checks[-1]
    monkeypatch.setattr(gpu_suite, "with_documents", lambda config: config)  # attends across starts
    gpu_suite.check_documents(results, kind, config, torch.device("cpu"))
    assert not results.checks[-1]["ok"], results.checks[-1]


def test_fla_check_passes_on_a_matching_kernel_and_fails_on_one_that_misses_the_decay(gpu_suite, monkeypatch):
    """check_fla (CUDA with flash-linear-attention only in the suite) rehearsed on the CPU: fla's
    kernel (gdn.fla_kernel) stands in as the torch chunked form at another chunk size, as a kernel
    blocks the work its own way (tests/helpers.py); the check passes on it, and fails on one that
    ignores the decay or that the model does not call. With documents, the layer packs the batch
    into one row of sequences (cu_seqlens): the check fails on a kernel that reads it as one."""
    from minitx.attention import gdn
    from minitx.attention.gdn import GatedDeltaNet

    monkeypatch.setattr(gdn.delta_rule, "fla_installed", lambda: True)
    monkeypatch.setattr(GatedDeltaNet, "use_fla", lambda self, q: self.backend == "fla")
    kind = "hybrid"  # two gdn layers of its pattern: T = 75 is a chunk of 64 and a partial one
    config = dataclasses.replace(tiny_config(gpu_suite, kind), n_layer=2)
    results = gpu_suite.Results(torch.device("cpu"), tiny=True)
    for documents in (False, True):
        monkeypatch.setattr(gdn.delta_rule, "fla_kernel", lambda: fla_stand_in())
        gpu_suite.check_fla(results, kind, config, torch.device("cpu"), documents)
        assert results.checks[-1]["ok"], results.checks[-1]["detail"]
        assert results.checks[-1]["name"] == ("fla vs torch, documents" if documents else "fla vs torch")
        monkeypatch.setattr(gdn.delta_rule, "fla_kernel", lambda: fla_stand_in(decays=False))
        gpu_suite.check_fla(results, kind, config, torch.device("cpu"), documents)
        assert not results.checks[-1]["ok"], results.checks[-1]["detail"]
    monkeypatch.setattr(gdn.delta_rule, "fla_kernel", lambda: fla_stand_in(packed=False))  # documents leak
    gpu_suite.check_fla(results, kind, config, torch.device("cpu"), documents=True)
    assert not results.checks[-1]["ok"], results.checks[-1]["detail"]
    monkeypatch.setattr(gdn.delta_rule, "fla_kernel", lambda: fla_stand_in())
    monkeypatch.setattr(GatedDeltaNet, "use_fla", lambda self, q: False)  # fla never runs
    gpu_suite.check_fla(results, kind, config, torch.device("cpu"), documents=True)
    assert not results.checks[-1]["ok"] and "ran in 0 of" in results.checks[-1]["detail"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, flag",
    [
        (["--device", "cuda", "--tiny"], "--device"),
        (["--device", "cpu", "--kinds", "mla-x"], "--kinds"),
        (["--device", "cpu", "--only", "everything"], "--only"),
        (["--device", "cpu"], "--out"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(tmp_path, args, flag):
    if flag == "--device" and torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here")
    extra = [] if flag == "--out" else ["--out", str(tmp_path / "out")]
    done = run_suite(*args, *extra, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and "Traceback" not in done.stderr, done.stderr


@pytest.mark.slow
def test_triton_check_passes_on_the_kernels_and_fails_on_a_broken_one(gpu_suite, monkeypatch):
    """check_triton (CUDA only in the suite) run here through Triton's interpreter at toy size: it
    passes on the kernels, and fails when they mix heads the wrong way round."""
    pytest.importorskip("triton")
    from minitx.attention.mta import triton_launch as mta_triton

    if not mta_triton.INTERPRET:
        pytest.skip("CUDA is here: the suite runs this check itself")
    config = tiny_config(gpu_suite, "mta")
    results = gpu_suite.Results(torch.device("cpu"), tiny=True)
    gpu_suite.check_triton(results, "mta", config, torch.device("cpu"), T=12)
    assert results.checks[-1]["ok"], results.checks[-1]["detail"]
    real_full_mix = mta_triton.full_mix
    monkeypatch.setattr(mta_triton, "full_mix", lambda mix: None if mix is None else real_full_mix(mix).T)
    gpu_suite.check_triton(results, "mta", config, torch.device("cpu"), T=12)
    assert not results.checks[-1]["ok"]


@pytest.mark.slow  # four short trainings: about a minute and a half of CPU
def test_muon_precision_check_passes_and_fails_a_broken_bfloat16_path(gpu_suite, monkeypatch):
    # Muon's step calls the name in its own module (optim is a package of one optimiser a file).
    from minitx.training.optim import muon

    config = tiny_config(gpu_suite, "mha")
    results = gpu_suite.Results(torch.device("cpu"), tiny=True)
    gpu_suite.check_muon_precision(results, "mha", config, torch.device("cpu"))
    newton_schulz = muon.newton_schulz

    def one_iteration_in_bfloat16(x, coefficients, steps):  # a bf16 path that stops early
        return newton_schulz(x, coefficients, steps if x.dtype == torch.float32 else 1)

    monkeypatch.setattr(muon, "newton_schulz", one_iteration_in_bfloat16)
    gpu_suite.check_muon_precision(results, "mha", config, torch.device("cpu"))
    assert [c["ok"] for c in results.checks] == [True, False], results.checks
    assert results.checks[0]["detail"].startswith("auto is float32 here")
