"""Decoding: how a model extends a sequence, below the model, which runs it (Transformer.generate).

sampling.py   one new token per row from the last logits: greedy, temperature, top-k, top-p
loop.py       the decode loop: prefill, steps through the cache or cropped, COMPILED_DECODING

The generate command, which loads a trained model and streams its text, is minitx/generation/.
"""

from .loop import COMPILED_DECODING, CachedSteps, CroppedSteps, check_prompt_fits, compiled_decoding, generate
from .sampling import check_options, pick_next, top_k_filter, top_p_filter

__all__ = [
    "COMPILED_DECODING",
    "CachedSteps",
    "CroppedSteps",
    "check_options",
    "check_prompt_fits",
    "compiled_decoding",
    "generate",
    "pick_next",
    "top_k_filter",
    "top_p_filter",
]
