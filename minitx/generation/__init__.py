"""Generation: the generate command, text from a trained model.

inputs.py     generate's option checks made before the checkpoint is read
command.py    the `generate` command: the prompt, text streamed as it is made

The decode loop behind `Transformer.generate` and the sampling filters are minitx/decoding/, below
the model; this package sits above it, as it loads a trained model (minitx/trained_model.py).
Importing this package loads no command, checkpoint reader or argparse.
"""
