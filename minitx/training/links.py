"""The keys the train command fills in from others: a flag may not set them, and no message offers them."""

# Keys the train command fills in from others (TrainCLI.add_arguments_to_parser links them): a
# config file may hold them (a run's saved config.yaml does), a flag may not.
LINKED = {
    "model.vocab_size": "data.vocab_size",
    "model.max_steps": "trainer.max_steps",
    "data.block_size": "model.block_size",
    "model.document_token": "data.documents",  # the tokenizer's end-of-text, with data.documents
}
# Those LightningCLI fills in as it parses, before its checks (TrainCLI links them from here); the
# others are filled in when the data module is built.
LINKED_AT_PARSE = ("data.block_size", "model.max_steps")
