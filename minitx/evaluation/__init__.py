"""Evaluation of trained checkpoints: whole-text perplexity, length extrapolation, task accuracy,
diagnostics.

    from minitx.evaluation import evaluate_checkpoint
    result = evaluate_checkpoint("runs/default/checkpoints/best.ckpt", lengths=[256, 512])

perplexity.py  sliding windows that score every token once
lengths.py     loss by context length and by position inside the context
texts.py       the text scored (the run's validation text or files) and its characters/bytes
tasks.py       exact match and per-item accuracy on a synthetic task's fresh test set
diagnostics.py attention sinks, massive activations, attention entropy, loss by position
evaluate.py    evaluate_checkpoint: all of it as one JSON-able dict
report.py plots.py command.py   the table, JSON and PNGs; the evaluate.py command
"""

from .evaluate import evaluate_checkpoint

__all__ = ["evaluate_checkpoint"]
