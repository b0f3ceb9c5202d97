"""Why did the showcase's d64 points at 5 tokens/param all land above their prediction from d32-d48?

Three candidate causes, each tested by an experiment whose answer could have gone either way:

1. the decay branched from a trunk: the same runs trained straight to that budget (same seed,
   same rate) should give the branch's loss exactly if branching changes nothing;
2. the rate: d64 trains at the rate confirmed there (x2 for mha, gqa, gated), lower than d48's
   x2.67, and a short run needs a higher rate more; trained at x2.67 and x4, the miss should close
   if the rate is the cause;
3. a law in compute alone: at equal compute the short budget is worse (a large model trained
   briefly against a small one trained long); the ladder's fit with an offset per budget (curves.py)
   against one curve, both from the CSV alone (printed by `ablate --report-only --from-csv`).

    python scripts/short_budget_experiment.py [--output runs/short_budget] [--parallel 2]

It trains 9 runs (mha, gqa, gated at d64 and 5 tokens/param, x2 straight, x2.67 and x4), about 3
minutes on 2 cores, and prints their losses beside the showcase's branches.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from minitx.ablation.plan.ladder import make_plan
from minitx.ablation.plan.sweep import load_sweep
from minitx.ablation.runs.launch import LocalLauncher, run_sweep
from minitx.ablation.runs.results import RunResults

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("mha", "gqa", "gated")
RATES = (2.0, 2.67, 4.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--output", default="runs/short_budget")
    parser.add_argument("--parallel", type=int, default=2)
    args = parser.parse_args()
    sweep = load_sweep(ROOT / "configs" / "ablation_ladder.yaml")
    plan = make_plan(sweep, Path(args.output))
    points = [plan.point(arm, "d64", 5, m, plan.ladder_seed, "seed") for arm in ARMS for m in RATES]
    run_sweep([p.run for p in points], sweep, Path(args.output), LocalLauncher(args.parallel), print)
    with open(ROOT / "docs" / "results" / "ladder" / "results.csv", encoding="utf-8") as handle:
        branches = {
            row["arm"]: float(row["final_val_loss"])
            for row in csv.DictReader(handle)
            if row["size"] == "d64" and row["budget"] == "5" and row["role"] == "branch"
        }
    trained = RunResults()
    print()
    print("| arm | branch (showcase, x2) | " + " | ".join(f"straight x{m:g}" for m in RATES) + " |")
    print("|---|---:|" + "---:|" * len(RATES))
    for arm in ARMS:
        losses = [trained(p).loss for p in points if p.arm == arm]
        cells = " | ".join("failed" if v is None else f"{v:.4f}" for v in losses)
        print(f"| {arm} | {branches.get(arm, float('nan')):.4f} | {cells} |")


if __name__ == "__main__":
    main()
