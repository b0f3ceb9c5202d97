"""`evaluate.py --attention-maps maps.png`: every layer's and head's attention over one prompt,
as each kind computes it materialised (Transformer.attention_maps: the weights a layer applies
to its values, after local's window, MTA's convolutions and head mixing, diff's subtraction).

One row per layer (named with its kind), one column per head; query positions down, key
positions across. A map with negative weights (differential attention) is drawn on a diverging
scale around 0, the others from 0 to 1.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import UserError
from ..files.atomic import write_atomically

DEFAULT_PROMPT = "ROMEO:\nBut, soft! what light through yonder window breaks?"
LABELLED_TOKENS = 40  # up to this many tokens the axes name them; beyond, only positions


def check_maps_path(path: str) -> None:
    """Refuse an output the drawing could not be written to, before the checkpoint is read."""
    target = Path(path)
    if target.is_dir():
        raise UserError(f"--attention-maps {path}: is a directory; give a file name such as maps.png")
    if target.suffix.lower() != ".png":
        raise UserError(f"--attention-maps {path}: maps are drawn as PNG; give a file name ending in .png")
    if not target.parent.is_dir():
        raise UserError(
            f"--attention-maps {path}: directory {str(target.parent)!r} does not exist; create it first"
        )


def prompt_tokens(tokenizer, prompt: str) -> list[int]:
    """The prompt's ids, all of them: draw_attention_maps keeps the last block_size."""
    try:
        ids = tokenizer.encode(prompt)
    except UserError as error:
        raise UserError(f"--attention-prompt: {error}; give a prompt in the model's vocabulary") from None
    if len(ids) < 2:
        raise UserError(f"--attention-prompt: {prompt!r} is {len(ids)} token(s); give at least 2")
    return ids


def _label(tokenizer, token: int) -> str:
    text = tokenizer.decode([token])
    return text.replace("\n", "\\n") or "·"


@torch.no_grad()
def draw_attention_maps(model, tokenizer, prompt: str, path: str) -> dict:
    """Draw every layer and head of `model` over `prompt` into the PNG `path`; returns what was
    drawn (tokens, layers, heads) for the command to report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.colors
    import matplotlib.pyplot as plt

    given = prompt_tokens(tokenizer, prompt)
    ids = given[-model.config.block_size :]  # the model sees at most block_size positions
    device = next(model.parameters()).device
    maps = [layer[0].float().cpu() for layer in model.attention_maps(torch.tensor([ids], device=device))]
    kinds = list(model.config.layer_kinds)
    heads = max(layer.shape[0] for layer in maps)
    size = 1.6 if len(ids) <= LABELLED_TOKENS else 2.2
    figsize = (size * heads + 1.6, size * len(maps) + 1)
    # layout="constrained": room for each row's colour bar
    fig, axes = plt.subplots(len(maps), heads, figsize=figsize, squeeze=False, layout="constrained")
    labels = [_label(tokenizer, token) for token in ids] if len(ids) <= LABELLED_TOKENS else None
    for row, (layer, kind) in enumerate(zip(maps, kinds)):
        signed = bool((layer < 0).any())
        bound = float(layer.abs().max()) or 1.0
        for head in range(heads):
            ax = axes[row][head]
            if head >= layer.shape[0]:
                ax.axis("off")
                continue
            if signed:  # gdn's map: signed and unnormalised, white at 0
                image = ax.imshow(layer[head].numpy(), cmap="RdBu_r", vmin=-bound, vmax=bound)
            else:  # a square-root scale: a row spreads its weight over many keys, so most weights are
                # small, and on a linear scale every cell but the largest few looks the same dark
                norm = matplotlib.colors.PowerNorm(gamma=0.5, vmin=0.0, vmax=1.0)
                image = ax.imshow(layer[head].numpy(), cmap="viridis", norm=norm)
            ax.set_title(f"layer {row} ({kind}) head {head}", fontsize=6)
            if labels is not None:
                ax.set_xticks(range(len(ids)), labels, fontsize=3, rotation=90)
                ax.set_yticks(range(len(ids)), labels, fontsize=3)
            else:
                ax.tick_params(labelsize=4)
        bar = fig.colorbar(image, ax=list(axes[row]), shrink=0.9, pad=0.01, aspect=15)
        bar.set_label("signed weight" if signed else "weight (square-root scale)", fontsize=5)
        bar.ax.tick_params(labelsize=4)
    fig.suptitle(f"attention over {len(ids)} tokens: query (down) x key (across)", fontsize=8)
    try:
        write_atomically(path, lambda file: fig.savefig(file, format="png", dpi=150))
    finally:
        plt.close(fig)
    return dict(tokens=len(ids), cut=len(given) - len(ids), layers=len(maps), heads=heads, kinds=kinds)
