"""The notebooks run headless from top to bottom on tiny settings, and are committed without outputs."""

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from minitx import ablation

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def run_notebook(name: str, monkeypatch, **env: str) -> nbformat.NotebookNode:
    monkeypatch.setenv("MPLBACKEND", "Agg")
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # the kernel inherits this process's environment
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(
        notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    ).execute()
    return notebook


def outputs_text(notebook: nbformat.NotebookNode) -> str:
    return json.dumps([cell.get("outputs", []) for cell in notebook.cells])


def fake_results(directory: Path) -> None:
    """A results directory written by the ablation code itself, from made-up run summaries."""
    sweep = ablation.Sweep(
        base_text="model: {}\n",
        overrides={},
        seed=1,
        seeds=2,
        variants=[
            ablation.Variant("mha", {}),
            ablation.Variant("local", {"model.attention.kind": "local"}),
            ablation.Variant("bad", {}),
        ],
    )
    runs = ablation.plan_runs(sweep, directory, seeds=2)
    for run in runs:
        run.directory.mkdir(parents=True)
        if run.variant.name == "bad":
            (run.directory / ablation.RUN_FILE).write_text(json.dumps({"status": "failed", "error": "boom"}))
            continue
        offset = 0.1 * run.seed + (0.3 if run.variant.name == "local" else 0.0)
        curve = [{"step": s, "tokens": 1000 * s, "val_loss": 3.0 - 0.1 * s + offset} for s in (1, 2, 3)]
        summary = {
            "params": 1000,
            "tokens_per_s": 500.0 + run.seed,
            "peak_memory_bytes": 2**20 * 300,
            "memory_kind": "cpu peak RSS",
            "kv_bytes_per_token": 64.0,
            "train_seconds": 10.0,
            "tokens_seen": 3000,
            "steps": 3,
            "device": "cpu",
            "curve": curve,
            "final_val_loss": curve[-1]["val_loss"],
            "best_val_loss": curve[-1]["val_loss"],
        }
        (run.directory / ablation.SUMMARY_FILE).write_text(json.dumps(summary))
    ablation.write_results(runs, directory)


def test_ablation_report_shows_a_results_directory(tmp_path, monkeypatch):
    fake_results(tmp_path)
    table = (tmp_path / "results.md").read_text()
    assert "| mha |" in table and "| 0/2 | 2/2 failed: boom |" in table
    notebook = run_notebook("ablation_report.ipynb", monkeypatch, MINITX_RESULTS_DIR=str(tmp_path))
    text = outputs_text(notebook)
    assert "image/png" in text and "| local |" in text and "boom" in text


@pytest.mark.slow  # runs a notebook end to end: about 5 s
def test_attention_maps_runs_on_fresh_models(monkeypatch):
    notebook = run_notebook("attention_maps.ipynb", monkeypatch, MINITX_TINY="1", MINITX_CHECKPOINTS="")
    text = outputs_text(notebook)
    assert "maps shown for: mha, mqa, gqa, local (window 6), mta (3x5 kernel, uniform)" in text
    assert text.count("image/png") == 5


@pytest.mark.parametrize("name", ["ablation_report.ipynb", "attention_maps.ipynb"])
def test_notebooks_are_committed_without_outputs(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
