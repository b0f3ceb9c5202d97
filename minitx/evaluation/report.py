"""What an evaluation shows: a table on stdout, a JSON file, PNG plots.

Writers take the finished result dict: nothing is written until every figure is computed, and
each file is written atomically.
"""

from __future__ import annotations

from pathlib import Path

from ..files.atomic import write_atomically
from ..kinds import registry
from .missing import missing_notes, shown
from .tasks import SIDES


def _header(result: dict) -> list[str]:
    model = result["model"]
    kinds = model["layers"]
    layers = f"{kinds[0]} x{len(kinds)}" if len(set(kinds)) == 1 else " ".join(kinds)
    return [
        f"checkpoint {result['checkpoint']}: {_positions(model['positions'], kinds)}, block_size {model['block_size']}, layers {layers}"
    ]


def _positions(positions: str, kinds: list[str]) -> str:
    """'rope positions', or what is true of the layers that do not read them (gdn: none)."""
    if positions != "rope":
        return f"{positions} positions"  # learned: added to the embeddings, every layer sees them
    without = [kind for kind in dict.fromkeys(kinds) if kind in registry and not registry[kind].reads_rope]
    if not without:
        return "rope positions"
    if len(without) == len(set(kinds)):
        return f"no positions ({'/'.join(without)}: order comes from the recurrence)"
    return f"rope positions ({'/'.join(without)} layers have none: order comes from the recurrence)"


def _length_rows(by_length: dict, what: str = "loss") -> list[str]:
    head = f"  {'context':>8}  {what:>9}  {'tokens':>9}"
    if _split(by_length):
        head += "".join(f"  {side:>16}" for side in SIDES)
    rows = [head]
    for length, entry in by_length.items():
        if "skipped" in entry:
            rows.append(f"  {length:>8}  skipped: {entry['skipped']}")
            continue
        row = f"  {length:>8}  {entry[what]:>9.4f}  {entry['tokens']:>9,}"
        if "near_items" in entry:
            row += "".join(f"  {_share(entry, side):>16}" for side in SIDES)
        rows.append(row)
    return rows


def _split(by_length: dict) -> bool:
    """Whether some length holds the split by where the answer lies (past the trained length)."""
    return any("near_items" in entry for entry in by_length.values())


def _share(entry: dict, side: str) -> str:
    """'0.9960 (250)': the accuracy of one side of a split and its number of answers."""
    accuracy = entry[f"{side}_accuracy"]
    return f"{'-' if accuracy is None else f'{accuracy:.4f}'} ({entry[f'{side}_items']:,})"


def _position_rows(curve: dict) -> list[str]:
    rows = [f"  {'position':>11}  {'loss':>9}  {'tokens':>9}"]
    for start, end, loss, tokens in zip(curve["start"], curve["end"], curve["loss"], curve["tokens"]):
        span = f"{start}" if end == start + 1 else f"{start}-{end - 1}"
        rows.append(f"  {span:>11}  {loss:>9.4f}  {tokens:>9,}")
    return rows


def _heatmap_rows(heatmap: dict) -> list[str]:
    rows = [
        "",
        "needle exact match, depth x context length:",
        "  " + f"{'depth':>6}" + "".join(f"{n:>8}" for n in heatmap["lengths"]),
    ]
    for depth, accuracies in zip(heatmap["depths"], heatmap["accuracy"]):
        cells = "".join(f"{'-':>8}" if a is None else f"{a:>8.2f}" for a in accuracies)
        rows.append(f"  {depth:>6.0%}{cells}")
    return rows


def diagnostic_rows(figures: dict, kinds: list[str]) -> list[str]:
    """The diagnostics (minitx/evaluation/diagnostics.py): the headline figures, then per layer."""
    rows = [
        f"diagnostics ({figures['n_sequences']} held-out sequences of {figures['seq_len']} tokens):",
        f"first-token share {shown(figures['first_token_share'], '.3f')}   "
        f"sink rate {shown(figures['sink_rate'], '.0%')}   "
        f"massive activation ratio {figures['massive_ratio']:.1f}   entropy {shown(figures['entropy'], '.3f')}",
        f"  {'layer':>5}  {'kind':<8}  {'max/median':>10}  {'position':>8}  {'channel':>7}  {'entropy':>7}",
    ]
    for layer, (massive, entropy) in enumerate(zip(figures["massive"], figures["entropy_by_layer"])):
        kind = kinds[layer] if layer < len(kinds) else "?"
        rows.append(
            f"  {layer:>5}  {kind:<8}  {massive['ratio']:>10.1f}  {massive['position']:>8}  "
            f"{massive['channel']:>7}  {shown(entropy, '.3f'):>7}"
        )
    rows += [f"  (-: {note})" for note in missing_notes(figures, kinds)]
    losses = figures["loss_by_position"]
    rows.append(f"loss by position: {losses[0]:.4f} at 1 token of context, {losses[-1]:.4f} at {len(losses)}")
    return rows


def table(result: dict) -> str:
    """The readable summary printed by evaluate.py."""
    lines = _header(result)
    unit = result.get("unit", "character")
    bits = result["bits_per_char"] if unit == "character" else result["bits_per_byte"]
    task = result.get("task")
    if task:
        lines.append(
            f"{result['text']}: {task['samples']:,} samples (seed {task['seed']}), {task['items']:,} answer tokens"
        )
        lines.append(
            f"exact match {task['exact_match']:.4f}   item accuracy {task['item_accuracy']:.4f}   "
            f"answer loss {result['loss']:.4f}   perplexity {result['perplexity']:.3f}   bits per {unit} {bits:.4f}"
        )
        for name, loss in (task.get("reference_losses") or {}).items():
            lines.append(
                f"  {name} strategy on the same samples: loss {loss:.4f} ({result['loss'] - loss:+.4f} nats)"
            )
        circuit = task.get("recall_circuit")
        if circuit and "skipped" in circuit:
            lines.append(f"  recall circuit: not read ({circuit['skipped']})")
        elif circuit:
            lines.append(
                f"  recall circuit ({circuit['samples']} samples): first layer, each value's weight on its key "
                f"{circuit['previous_key']:.3f}; last layer, each query's weight on its value {circuit['value_read']:.3f}"
            )
    else:
        lines.append(
            f"text: {result['text']}: {result['tokens']:,} tokens scored, context {result['context']}, stride {result['stride']}"
        )
        lines.append(
            f"loss {result['loss']:.4f}   perplexity {result['perplexity']:.3f}   bits per {unit} {bits:.4f}"
        )
    if task and task.get("heatmap"):
        lines += ["", "needle exact match by context length (mean over depths):"]
        lines += _length_rows(result["by_length"], "accuracy") + _heatmap_rows(task["heatmap"])
    elif task and result.get("by_length"):
        lines += ["", "item accuracy by input length (fresh samples at each):"]
        lines += _length_rows(result["by_length"], "accuracy")
        if _split(result["by_length"]):
            lines.append(
                "  past the trained length, by where the letter to copy lies (answers in brackets): near / far:"
                " within a distance of the query trained samples hold, or beyond; early / late: at a trained"
                " position, or past"
            )
    elif result.get("by_length"):
        n = result["sweep_tokens"]
        swept = "the whole text" if n == result["tokens"] else f"the first {n:,} tokens"
        lines += ["", f"loss by context length ({swept}, non-overlapping windows of that many tokens):"]
        lines += _length_rows(result["by_length"])
    if result.get("by_position"):
        context = result["context"]
        lines += ["", f"loss by position inside the context (tokens before the target, context {context}):"]
        lines += _position_rows(result["by_position"])
    if result.get("diagnostics"):
        lines += [""] + diagnostic_rows(result["diagnostics"], result["model"]["layers"])
    return "\n".join(lines)


def write_plots(directory: str | Path, result: dict) -> list[Path]:
    """PNG plots into `directory`; returns their paths."""
    from . import plots  # matplotlib is slow to import: only when plots are asked for

    written = []
    for name, draw in plots.figures(result):
        written.append(Path(directory) / name)
        write_atomically(written[-1], draw)
    return written
