"""What a run prints besides its progress: the model summary (no FLOPs line Lightning cannot
count) and the sample at the end (it stops at the end-of-text token, as generate.py does)."""

from __future__ import annotations

import torch

from minitx.training import command
from minitx.training.run import ParameterSummary, trainer_arguments
from minitx.training.runsection import RunSettings


def test_the_model_summary_has_no_flops(capsys, tmp_path):
    data = [(" ", ["0"]), ("Name", ["model"]), ("Type", ["Transformer"]), ("Params", ["797 K"]),
            ("Mode", ["train"]), ("FLOPs", ["0"])]  # fmt: skip
    ParameterSummary.summarize(data, 797_000, 797_000, 3.189, {"train": 51, "eval": 0}, total_flops=0)
    out = capsys.readouterr().out
    assert "FLOPs" not in out and "Flops" not in out
    assert "0 | model | Transformer | 797 K  | train" in out and "797 K      Total params" in out
    # It replaces Lightning's default summary, unless the user turned summaries off or gave one.
    run = RunSettings(root=str(tmp_path), name="r")
    args = trainer_arguments(run, {})
    assert args["enable_model_summary"] is False
    assert sum(isinstance(c, ParameterSummary) for c in args["callbacks"]) == 1
    off = trainer_arguments(run, {"enable_model_summary": False})
    assert not any(isinstance(c, ParameterSummary) for c in off["callbacks"])


class Letters:
    eos_id = 0

    def decode(self, ids):
        return "".join("<|endoftext|>" if i == 0 else chr(ord("a") + i) for i in ids)


def test_the_sample_stops_at_end_of_text(monkeypatch):
    seen = {}

    def fake_generate(model, idx, max_new_tokens, temperature, top_k, eos_id=None):
        seen["eos_id"] = eos_id
        return torch.cat([idx, torch.tensor([[3, 4, 0, 5]])], dim=1)

    monkeypatch.setattr(command, "generate", fake_generate)
    model = torch.nn.Linear(1, 1)
    assert command.sample_text(model, Letters(), [0, 1], 4) == "bde"  # the prompt's end-of-text too
    assert seen["eos_id"] == 0
