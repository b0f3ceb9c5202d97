"""Keys the train command fills in from others, in one table that the front (precheck.py) and
LightningCLI's parser (command.py, TrainCLI.add_arguments_to_parser) both read.

A config file may hold a linked key (a run's saved config.yaml does), a flag may not.
"""

from __future__ import annotations

# {linked key: the key it is filled in from}
LINKED = {
    "model.vocab_size": "data.vocab_size",
    "model.max_steps": "trainer.max_steps",
    "data.block_size": "model.block_size",
    "model.document_token": "data.documents",  # the tokenizer's end-of-text, with data.documents
}
# Those LightningCLI fills in as it parses, before its checks; the others are filled in when the
# data module is built.
LINKED_AT_PARSE = ("data.block_size", "model.max_steps")
