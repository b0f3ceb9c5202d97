"""The MTA paper's toy task: every sample is well formed, its answer is right, splits are fixed."""

import pytest
import torch

from minitx.data.toy import (
    BLOCK_SEP,
    IGNORE_INDEX,
    LETTERS,
    QUERY_SEP,
    ToyTaskConfig,
    ToyTrainBatches,
    ToyValSet,
    exact_match,
    toy_batch,
    toy_max_length,
    toy_sample,
    toy_samples,
    toy_tokenizer,
)
from minitx.errors import UserError


def parse(text: str, config: ToyTaskConfig) -> tuple[list[str], str, str]:
    """Split a sample's text back into (blocks, query, target) by its format alone."""
    prompt_blocks, rest = text.split(QUERY_SEP)
    query, target = rest[: config.query_len], rest[config.query_len :]
    return prompt_blocks.split(BLOCK_SEP), query, target


@pytest.mark.parametrize("target", ["block", "first", "last"])
@pytest.mark.parametrize("block_len,min_blocks,max_blocks", [(5, 10, 10), (3, 1, 7), (2, 2, 30)])
def test_every_sample_has_exactly_one_answer_block_and_the_right_target(
    target, block_len, min_blocks, max_blocks
):
    config = ToyTaskConfig(block_len=block_len, min_blocks=min_blocks, max_blocks=max_blocks, target=target)
    for sample in toy_samples(config, seed=7, count=300):
        blocks, query, answer = parse(sample.text, config)
        assert min_blocks <= len(blocks) <= max_blocks
        assert len(query) == config.query_len and len(set(query)) == config.query_len
        for block in blocks:
            assert len(block) == block_len and len(set(block)) == block_len and set(block) <= set(LETTERS)
        # Checked from the text alone, not from the generator's own bookkeeping.
        holders = [i for i, block in enumerate(blocks) if set(query) <= set(block)]
        assert holders == [sample.answer_index]
        block = blocks[holders[0]]
        assert answer == {"block": block, "first": block[0], "last": block[-1]}[target]
        assert sample.target == answer and sample.prompt + answer == sample.text
        assert sample.ids == toy_tokenizer().encode(sample.text)
        assert [i for i, m in enumerate(sample.loss_mask) if m] == list(
            range(len(sample.text) - len(answer), len(sample.text))
        )
        assert len(sample.text) <= toy_max_length(config)


def test_distractor_blocks_share_query_letters_sometimes():
    # Otherwise a single letter would find the block and the task would not need two at once.
    config = ToyTaskConfig(block_len=5, min_blocks=10, max_blocks=10)
    partial = 0
    for sample in toy_samples(config, seed=0, count=100):
        blocks, query, _ = parse(sample.text, config)
        partial += sum(1 for i, b in enumerate(blocks) if i != sample.answer_index and set(query) & set(b))
    assert partial > 100


def test_samples_and_split_are_deterministic_by_seed():
    config = ToyTaskConfig(block_len=4, min_blocks=3, max_blocks=8)
    assert toy_samples(config, 3, 20) == toy_samples(config, 3, 20)
    assert [s.text for s in toy_samples(config, 3, 20)] != [s.text for s in toy_samples(config, 4, 20)]
    train = ToyTrainBatches(config, seed=3, train_size=50, batch_size=8)
    again = ToyTrainBatches(config, seed=3, train_size=50, batch_size=8, start_batch=2)
    batches = [b for _, b in zip(range(3), train)]
    x2, y2 = next(iter(again))  # resuming at batch 2 gives batch 2
    assert torch.equal(batches[2][0], x2) and torch.equal(batches[2][1], y2)
    val = ToyValSet(config, seed=3, train_size=50, size=30)
    val_texts = {toy_sample(config, 3, 50 + i).text for i in range(len(val))}
    train_texts = {toy_sample(config, 3, i).text for i in range(50)}
    assert not val_texts & train_texts
    assert torch.equal(val[4][0], ToyValSet(config, seed=3, train_size=50, size=30)[4][0])


def test_training_batches_cycle_through_the_training_set_only():
    config = ToyTaskConfig(block_len=3, min_blocks=2, max_blocks=4)
    batches = ToyTrainBatches(config, seed=1, train_size=10, batch_size=4)
    x, _ = batches.batch(2)  # samples 8, 9, 0, 1
    expected, _ = toy_batch([toy_sample(config, 1, i) for i in (8, 9, 0, 1)], batches.length)
    assert torch.equal(x, expected)


def test_batch_targets_are_ignored_off_the_answer():
    config = ToyTaskConfig(block_len=3, min_blocks=2, max_blocks=5, target="block")
    samples = toy_samples(config, 0, 6)
    x, y = toy_batch(samples, toy_max_length(config) - 1)
    assert x.shape == y.shape == (6, toy_max_length(config) - 1)
    tok = toy_tokenizer()
    for row, sample in enumerate(samples):
        kept = y[row][y[row] != IGNORE_INDEX].tolist()
        assert tok.decode(kept) == sample.target
        # The input at each target position is the previous token: next-token prediction.
        assert tok.decode(x[row, : len(sample.ids) - 1].tolist()) == sample.text[:-1]


def test_exact_match_counts_rows_whose_whole_target_is_right():
    y = torch.tensor([[IGNORE_INDEX, 1, 2], [IGNORE_INDEX, 3, 0], [IGNORE_INDEX] * 3])
    logits = torch.zeros(3, 3, 5)
    logits[0, 1, 1] = logits[0, 2, 2] = 1  # row 0 right
    logits[1, 1, 3] = logits[1, 2, 4] = 1  # row 1 half right: wrong
    assert exact_match(logits, y).item() == pytest.approx(0.5)  # row 2 has no target: skipped


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(block_len=0),
        dict(block_len=27),
        dict(query_len=6, block_len=5),
        dict(min_blocks=3, max_blocks=2),
        dict(target="middle"),
    ],
)
def test_bad_settings_are_user_errors(kwargs):
    with pytest.raises(UserError):
        ToyTaskConfig(**kwargs)


def test_the_datamodule_serves_the_toy_task_and_training_scores_exact_match():
    import lightning as L

    from minitx.data.datamodule import TextDataModule
    from minitx.training import MinitxLM

    def datamodule(block_size=20):
        return TextDataModule(
            source="toy",
            task={"toy": {"n": 3, "blocks": 4}},
            toy_train_size=50,
            toy_val_size=8,
            batch_size=4,
            block_size=block_size,
            seed=2,
        )

    config = ToyTaskConfig(block_len=3, min_blocks=4, max_blocks=4)
    dm = datamodule()
    assert dm.vocab_size == 28 and dm.tokenizer.fingerprint() == toy_tokenizer().fingerprint()
    x, y = next(iter(dm.train_dataloader()))
    expected = ToyTrainBatches(config, seed=2, train_size=50, batch_size=4).batch(0)
    assert torch.equal(x, expected[0]) and torch.equal(y, expected[1])
    val_x, val_y = next(iter(dm.val_dataloader()))
    assert torch.equal(val_x[0], ToyValSet(config, seed=2, train_size=50, size=8)[0][0])
    with pytest.raises(UserError, match="block_size"):
        datamodule(block_size=10).setup()

    model = MinitxLM(vocab_size=28, block_size=20, n_layer=1, n_head=2, d_model=16)
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False
    )
    trainer.validate(model, datamodule=dm, verbose=False)
    metrics = trainer.callback_metrics
    # The logged numbers are those of the targets alone, averaged over the validation batches.
    with torch.no_grad():
        batches = [(model.model(bx), by) for bx, by in dm.val_dataloader()]
    losses = [
        torch.nn.functional.cross_entropy(lg[by != IGNORE_INDEX], by[by != IGNORE_INDEX])
        for lg, by in batches
    ]
    assert float(metrics["val_loss"]) == pytest.approx(float(torch.stack(losses).mean()), rel=1e-5)
    accuracy = torch.stack([exact_match(lg, by) for lg, by in batches]).mean()
    assert float(metrics["val_accuracy"]) == pytest.approx(float(accuracy))
