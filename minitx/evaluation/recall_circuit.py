"""Where a two-layer model's attention looks on a recall task: the two heads of the recall circuit.

Attention recalls in two steps (Olsson et al. 2022's induction heads; Zoology, Arora et al. 2023,
section 3): the first layer copies each key into the token after it, the value (a
previous-token head), and the last layer's query, the key asked again, attends to the value
that now carries its key. Zoology's MQAR has K such pairs and queries; the induction-heads task
has one (the trigger, its letter, the trigger again at the end). A model on the task's plateau
has not formed the first step, and the last layer has nothing to match; these two weights say
which step is missing:

- `previous_key`: the first layer's attention weight, at each value's position, on its key (the
  token before it), averaged over heads, values and samples;
- `value_read`: the last layer's weight, at each query, on the position of the value it asks for.

Both are read off the materialised attention maps (`Transformer.attention_maps`) at the positions
each sample gives (`sample.recall_positions()`: keys, values and queries, pair by pair). A kind
whose map is not a distribution (diff's difference of two maps) gives signed weights: read them
as such. A uniform causal map gives each a weight of 1 / (the position + 1).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True)
class RecallCircuit:
    previous_key: float  # first layer: weight on the key, seen from its value
    value_read: float  # last layer: weight on the asked value, seen from the query

    def to_dict(self) -> dict:
        return asdict(self)


def recall_circuit(maps: list[Tensor], samples: list) -> RecallCircuit:
    """The circuit's two weights from each layer's attention maps (B, H, T, T) over `samples`
    (row b of every map is samples[b]'s input, ids[:-1]; each sample has `recall_positions`)."""
    first, last = maps[0].float(), maps[-1].float()
    previous_key, value_read = [], []
    for row, sample in enumerate(samples):
        keys, values, queries = (torch.tensor(p) for p in sample.recall_positions())
        previous_key.append(first[row, :, values, keys].mean().item())
        value_read.append(last[row, :, queries, values].mean().item())
    return RecallCircuit(float(np.mean(previous_key)), float(np.mean(value_read)))
