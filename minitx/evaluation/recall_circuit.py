"""Where a two-layer model's attention looks on Zoology's MQAR: the two heads of the recall circuit.

Attention solves associative recall in two steps (Olsson et al. 2022's induction heads; Zoology,
Arora et al. 2023, section 3): the first layer copies each key into the token after it, the
value (a previous-token head), and the last layer's query, the key asked again, attends to the
value that now carries its key. A model on the 1/K plateau has not formed the first step, and
the last layer has nothing to match; these two weights say which step is missing:

- `previous_key`: the first layer's attention weight, at each value's position, on its key (the
  token before it), averaged over heads, values and samples;
- `value_read`: the last layer's weight, at each query, on the position of the value it asks for.

Both are read off the materialised attention maps (`Transformer.attention_maps`). A kind whose
map is not a distribution (diff's difference of two maps) gives signed weights: read them as
such.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from minitx.data.zoology import ZoologySample


@dataclass(frozen=True)
class RecallCircuit:
    previous_key: float  # first layer: weight on the key, seen from its value
    value_read: float  # last layer: weight on the asked value, seen from the query


def recall_circuit(maps: list[Tensor], samples: list[ZoologySample]) -> RecallCircuit:
    """The circuit's two weights from each layer's attention maps (B, H, T, T) over `samples`
    (row b of every map is samples[b]'s input, ids[:-1])."""
    first, last = maps[0].float(), maps[-1].float()
    previous_key, value_read = [], []
    for row, sample in enumerate(samples):
        pairs = len(sample.keys)
        values = torch.arange(pairs) * 2 + 1  # pair i is k_i v_i at 2i, 2i + 1
        previous_key.append(first[row, :, values, values - 1].mean().item())
        queries = 2 * pairs + 2 * torch.tensor(sample.gaps)  # pair i's query (zoology_sample)
        value_read.append(last[row, :, queries, values].mean().item())
    return RecallCircuit(float(np.mean(previous_key)), float(np.mean(value_read)))
