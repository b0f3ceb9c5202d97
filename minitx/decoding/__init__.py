"""Decoding: how a model extends a sequence, below the model, which runs it (Transformer.generate).

sampling.py   one new token per row from the last logits: greedy, temperature, top-k, top-p
loop.py       the decode loop: prefill, steps through the cache or cropped, COMPILED_DECODING

The generate command, which loads a trained model and streams its text, is minitx/generation/.
"""
