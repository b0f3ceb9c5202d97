"""The streaming data pipeline (minitx/data/prepare/, streams.py, shards.py): the ids it writes
equal the whole-text encoding, at any piece size; record files; many shards read as one; batches a
pure function of (seed, rank, n); the prepare command; the TinyStories config offline.

Faults (killed prepares, bad UTF-8, a full disk, damaged shards, ...) are in test_prepare_faults.py.
"""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import yaml

from minitx.cli import prepare_main, train_main
from minitx.data import prepare as prepare_module
from minitx.data import shards as shards_module
from minitx.data import streams
from minitx.data.datamodule import TextDataModule
from minitx.data.prepare import DataSettings, prepare
from minitx.data.shards import TokenArray
from minitx.data.sources import shakespeare_text
from minitx.data.streams import JoinedText, bytes_part
from minitx.data.tokenizer import CharTokenizer, build_tokenizer

REPO = Path(__file__).resolve().parents[2]


def random_text(seed: int, lines: int, alphabet: str = "the quick brown fox é€ jumps") -> str:
    """Lines of random words with the awkward bits: blank lines, runs of spaces, multi-byte characters."""
    rng = random.Random(seed)
    words = alphabet.split()
    out = []
    for _ in range(lines):
        roll = rng.random()
        if roll < 0.1:
            out.append("")
        elif roll < 0.15:
            out.append("   " + rng.choice(words))
        else:
            out.append(" ".join(rng.choice(words) for _ in range(rng.randint(1, 12))))
    return "\n".join(out) + "\n"


@pytest.fixture
def tiny_pieces(monkeypatch):
    """Pieces, batches and reads of a few hundred bytes: every text is cut many times."""
    monkeypatch.setattr(prepare_module.tuning, "PIECE_BYTES", 97)
    monkeypatch.setattr(prepare_module.tuning, "BATCH_BYTES", 500)
    monkeypatch.setattr(streams, "BLOCK_BYTES", 211)


def ids(array: TokenArray) -> np.ndarray:
    return np.asarray(array)


# ------------------------------------------------------------------------------- equal to the whole text


def test_char_ids_equal_the_whole_text_encoding_at_any_piece_size(tmp_path, tiny_pieces):
    train, val = random_text(1, 400), random_text(2, 60)
    (tmp_path / "a.txt").write_text(train[:3000])
    (tmp_path / "b.txt").write_text(train[3000:])
    (tmp_path / "val.txt").write_text(val)
    prepared = prepare(
        DataSettings(
            source="files",
            train_files=str(tmp_path / "[ab].txt"),
            val_files=str(tmp_path / "val.txt"),
            cache_dir=str(tmp_path / "cache"),
            shard_tokens=700,
        )
    )
    joined = train[:3000] + "\n" + train[3000:]  # files are joined by a newline, as always
    whole = CharTokenizer(joined + val)  # a character vocabulary is fitted on both splits
    assert prepared.tokenizer.to_dict() == whole.to_dict()
    assert np.array_equal(ids(prepared.train), whole.encode_corpus(joined))
    assert np.array_equal(ids(prepared.val), whole.encode_corpus(val))
    assert len(prepared.train.paths) > 3  # many shards, read as one array
    assert prepared.text_size("val") == (len(val), len(val.encode("utf-8")))


def test_val_fraction_splits_at_a_line_end_and_the_splits_join_to_the_whole(tmp_path, tiny_pieces):
    text = random_text(3, 300)
    (tmp_path / "corpus.txt").write_text(text)
    settings = DataSettings(
        source="files", train_files=str(tmp_path / "corpus.txt"), val_fraction=0.2, cache_dir=str(tmp_path)
    )
    prepared = prepare(settings)
    tokenizer = CharTokenizer(text)
    both = np.concatenate([ids(prepared.train), ids(prepared.val)])
    assert np.array_equal(both, tokenizer.encode_corpus(text))
    val_text = tokenizer.decode(ids(prepared.val).tolist())
    assert text.endswith(val_text) and 0.15 < len(val_text) / len(text) < 0.25
    assert text[len(text) - len(val_text) - 1] == "\n"  # the cut is at a line end


def test_shakespeare_ids_equal_the_whole_text_encoding(tmp_path):
    prepared = prepare(DataSettings(cache_dir=str(tmp_path)))
    train, val = shakespeare_text()
    tokenizer = CharTokenizer(train + val)
    assert prepared.tokenizer.to_dict() == tokenizer.to_dict()
    assert np.array_equal(ids(prepared.train), tokenizer.encode_corpus(train))
    assert np.array_equal(ids(prepared.val), tokenizer.encode_corpus(val))


def test_bpe_ids_and_tokenizer_equal_the_whole_text_path(tmp_path, tiny_pieces):
    """A text smaller than the BPE sample: both paths train on all of it, so they must agree exactly."""
    train, val = random_text(4, 300), random_text(5, 40)
    (tmp_path / "train.txt").write_text(train)
    (tmp_path / "val.txt").write_text(val)
    prepared = prepare(
        DataSettings(
            source="files",
            train_files=str(tmp_path / "train.txt"),
            val_files=str(tmp_path / "val.txt"),
            tokenizer="bpe",
            bpe_vocab_size=300,
            cache_dir=str(tmp_path / "cache"),
            shard_tokens=500,
        )
    )
    whole = build_tokenizer("bpe", train, 300)
    assert prepared.tokenizer.fingerprint() == whole.fingerprint()
    assert np.array_equal(ids(prepared.train), whole.encode_corpus(train))
    assert np.array_equal(ids(prepared.val), whole.encode_corpus(val))


def test_bpe_trains_on_a_sample_drawn_from_across_the_corpus(tmp_path, monkeypatch):
    head, tail = "alpha beta gamma\n" * 4000, "omega psi chi\n" * 4000
    (tmp_path / "corpus.txt").write_text(head + tail)
    seen: list[str] = []
    real = prepare_module.tokenise._bpe_sample

    def spy(settings, source):
        for piece in real(settings, source):
            seen.append(piece)
            yield piece

    monkeypatch.setattr(prepare_module.tokenise, "_bpe_sample", spy)
    monkeypatch.setattr(prepare_module.tuning, "SAMPLE_WINDOW_BYTES", 4096)
    prepare(
        DataSettings(
            source="files",
            train_files=str(tmp_path / "corpus.txt"),
            val_fraction=0.05,
            tokenizer="bpe",
            bpe_vocab_size=300,
            tokenizer_train_bytes=40_000,
            cache_dir=str(tmp_path / "cache"),
        )
    )
    sample = "".join(seen)
    assert len(sample.encode()) <= 60_000 < len(head + tail)  # bounded, about tokenizer_train_bytes
    assert "alpha" in sample and "omega" in sample  # from the head and from the end


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_a_single_line_longer_than_any_piece_is_cut_between_words(tmp_path, monkeypatch, tokenizer):
    monkeypatch.setattr(streams, "MAX_LINE_BYTES", 300)
    monkeypatch.setattr(streams, "BLOCK_BYTES", 128)
    monkeypatch.setattr(prepare_module.tuning, "PIECE_BYTES", 64)
    rng = random.Random(6)
    line = " ".join(rng.choice(["lorem", "ipsum", "dolor", "sit", "amet,"]) for _ in range(2000))
    (tmp_path / "line.txt").write_text(line)
    (tmp_path / "val.txt").write_text(line[:500])
    settings = DataSettings(
        source="files",
        train_files=str(tmp_path / "line.txt"),
        val_files=str(tmp_path / "val.txt"),
        tokenizer=tokenizer,
        bpe_vocab_size=280,
        cache_dir=str(tmp_path / "cache"),
    )
    prepared = prepare(settings)
    whole = CharTokenizer(line) if tokenizer == "char" else build_tokenizer("bpe", line, 280)
    assert prepared.tokenizer.fingerprint() == whole.fingerprint()
    assert np.array_equal(ids(prepared.train), whole.encode_corpus(line))


def test_pieces_cover_the_text_and_cut_only_where_tokens_cannot_change(monkeypatch):
    rng = random.Random(7)
    bpe = build_tokenizer("bpe", random_text(8, 200), 300)
    for _trial in range(150):
        parts = [
            bytes_part(
                f"part{i}",
                "".join(
                    rng.choice(["a", "b", " ", "\n", "é", "\n\n", "  "]) for _ in range(rng.randint(0, 150))
                ).encode(),
            )
            for i in range(rng.randint(1, 3))
        ]
        text = JoinedText(parts, "data.train_files")
        whole = b"\n".join(part.open().read() for part in parts)
        monkeypatch.setattr(streams, "BLOCK_BYTES", rng.randint(1, 40))
        monkeypatch.setattr(streams, "MAX_LINE_BYTES", rng.randint(8, 80))
        start = rng.randint(0, len(whole))
        end = rng.randint(start, len(whole))
        pieces = list(text.pieces(start, end, rng.randint(1, 30)))
        assert b"".join(data for _, data in pieces) == whole[start:end]
        assert all(data for _, data in pieces)
        assert [offset for offset, _ in pieces] == list(np.cumsum([len(d) for _, d in pieces]) + start)
        if start == 0 and end == len(whole):  # cut where the library splits the same way
            joined = np.concatenate([bpe.encode_corpus(d.decode()) for _, d in pieces] or [np.zeros(0)])
            assert np.array_equal(joined, bpe.encode_corpus(whole.decode()))
        assert start <= text.cut_at_or_after(start) <= len(whole)
        assert 0 <= text.cut_at_or_before(start) <= start


# ------------------------------------------------------------------------------- record files


def write_records(path: Path, documents: list[str], column: str = "text") -> None:
    import datasets

    table = datasets.Dataset.from_dict({column: documents, "id": list(range(len(documents)))})
    suffix = path.suffix
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps({column: d, "id": i}) + "\n" for i, d in enumerate(documents)))
    elif suffix == ".parquet":
        table.to_parquet(str(path))
    elif suffix == ".csv":
        table.to_csv(str(path), index=False)
    else:
        raise ValueError(suffix)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".csv"])
def test_record_files_are_documents_separated_by_end_of_text(tmp_path, suffix):
    documents = [random_text(i, 5).strip() for i in range(40)]
    write_records(tmp_path / f"docs{suffix}", documents)
    prepared = prepare(
        DataSettings(
            source="files",
            train_files=str(tmp_path / f"docs{suffix}"),
            val_fraction=0.25,
            tokenizer="bpe",
            bpe_vocab_size=300,
            cache_dir=str(tmp_path / "cache"),
        )
    )
    eos = prepared.tokenizer.eos_id
    # Every 4th record (val_fraction 0.25, spread evenly from the start) is validation.
    val_docs = [d for i, d in enumerate(documents) if int((i + 1) * 0.25) > int(i * 0.25)]
    train_docs = [d for d in documents if d not in val_docs]
    for split, docs in (("train", train_docs), ("val", val_docs)):
        expected = np.concatenate([np.r_[eos, prepared.tokenizer.encode(d)] for d in docs])
        assert np.array_equal(ids(getattr(prepared, split)), expected), split


def test_records_with_a_char_tokenizer_are_joined_by_newlines(tmp_path):
    documents = ["first story.", "", "second one,\nwith two lines.", "third."]
    write_records(tmp_path / "docs.jsonl", documents)
    write_records(tmp_path / "val.jsonl", ["a held-out story."])
    prepared = prepare(
        DataSettings(
            source="files",
            train_files=str(tmp_path / "docs.jsonl"),
            val_files=str(tmp_path / "val.jsonl"),
            cache_dir=str(tmp_path / "cache"),
        )
    )
    decode = prepared.tokenizer.decode
    assert decode(ids(prepared.train).tolist()) == "\n".join(d for d in documents if d)
    assert decode(ids(prepared.val).tolist()) == "a held-out story."


def test_max_tokens_takes_a_prefix(tmp_path):
    documents = [random_text(i, 4) for i in range(30)]
    write_records(tmp_path / "docs.jsonl", documents)
    settings = dict(
        source="files",
        train_files=str(tmp_path / "docs.jsonl"),
        val_fraction=0.1,
        tokenizer="bpe",
        bpe_vocab_size=300,
    )
    full = prepare(DataSettings(**settings, cache_dir=str(tmp_path / "full")))
    part = prepare(DataSettings(**settings, cache_dir=str(tmp_path / "part"), max_tokens=500))
    assert len(part.train) == 500
    assert np.array_equal(ids(part.train), ids(full.train)[:500])


# ------------------------------------------------------------------------------- shards and batches


def test_windows_across_shards_equal_one_array(tmp_path, tiny_pieces):
    text = random_text(9, 500)
    (tmp_path / "corpus.txt").write_text(text)
    settings = dict(source="files", train_files=str(tmp_path / "corpus.txt"), val_fraction=0.1)
    one = prepare(DataSettings(**settings, cache_dir=str(tmp_path / "one")))
    many = prepare(DataSettings(**settings, cache_dir=str(tmp_path / "many"), shard_tokens=333))
    assert len(one.train.paths) == 1 and len(many.train.paths) > 5
    reference = ids(one.train)
    rng = np.random.default_rng(0)
    for start in rng.integers(0, len(reference) - 700, 50):
        assert np.array_equal(many.train.window(int(start), 700), reference[start : start + 700])
    positions = rng.integers(0, len(reference), (7, 9))
    assert np.array_equal(many.train[positions], reference[positions])
    assert np.array_equal(many.train[10:20], reference[10:20]) and many.train[-1] == reference[-1]


def data_module(tmp_path: Path, cache: str, **overrides) -> TextDataModule:
    settings = dict(
        source="files",
        train_files=str(tmp_path / "corpus.txt"),
        val_fraction=0.1,
        block_size=32,
        batch_size=4,
        cache_dir=str(tmp_path / cache),
    )
    return TextDataModule(**{**settings, **overrides})


def batches(module: TextDataModule, count: int) -> list:
    loader = iter(module.train_dataloader())
    return [next(loader) for _ in range(count)]


def test_batch_n_depends_only_on_seed_rank_and_n_whatever_the_shards(tmp_path, monkeypatch, tiny_pieces):
    (tmp_path / "corpus.txt").write_text(random_text(10, 800))
    one = data_module(tmp_path, "one")
    many = data_module(tmp_path, "many", shard_tokens=500)
    one.setup()
    many.setup()
    assert len(many.train_tokens.paths) > 5
    expected = batches(one, 6)
    for (x, y), (x2, y2) in zip(expected, batches(many, 6), strict=True):
        assert x.equal(x2) and y.equal(y2) and x[:, 1:].equal(y[:, :-1])
    # Resuming at batch 4 draws exactly batches 4 and 5.
    many.train_batches_drawn = 4
    for (x, _), (x2, _) in zip(expected[4:], batches(many, 2), strict=True):
        assert x.equal(x2)
    # Another rank draws other windows from the same shards.
    monkeypatch.setattr(TextDataModule, "_global_rank", lambda self: 1)
    many.train_batches_drawn = 0
    assert not any(x.equal(x2) for (x, _), (x2, _) in zip(expected, batches(many, 6), strict=True))


def test_workers_map_the_shards_themselves(tmp_path, tiny_pieces):
    (tmp_path / "corpus.txt").write_text(random_text(11, 400))
    module = data_module(tmp_path, "cache", shard_tokens=400)
    module.setup()
    expected = batches(module, 4)
    with_workers = data_module(tmp_path, "cache", shard_tokens=400, num_workers=2)
    with_workers.setup()
    for (x, _), (x2, _) in zip(expected, batches(with_workers, 4), strict=True):
        assert x.equal(x2)

    # Linux forks its workers (nothing pickled): pickling, as a spawned worker's start does, is
    # checked here. The copy holds no map of its parent's and maps the shards when it reads.
    tokens = module.train_tokens
    window = tokens.window(350, 100)  # across the first shard's end: both shards mapped
    copy = pickle.loads(pickle.dumps(tokens))
    assert all(handle is None for handle in copy._maps)
    assert np.array_equal(copy.window(350, 100), window)


def test_a_start_reads_each_shard_header_once(tmp_path, tiny_pieces, monkeypatch):
    """Opening prepared data checks each header against the manifest and hands it to the arrays."""
    (tmp_path / "corpus.txt").write_text(random_text(11, 400))
    data_module(tmp_path, "cache", shard_tokens=400).setup()
    read = []
    original = shards_module.read_header

    def counted(path):
        read.append(Path(path).name)
        return original(path)

    monkeypatch.setattr(shards_module, "read_header", counted)
    monkeypatch.setattr(prepare_module.manifest, "read_header", counted)
    module = data_module(tmp_path, "cache", shard_tokens=400)
    module.setup()
    shards = [s for c in module.prepared.manifest["checkpoints"] for s in c["shards"]]
    assert len(shards) > 2 and sorted(read) == sorted(s["file"] for s in shards)
    # and each array got its own shards' headers, in order
    train = [s["tokens"] for s in shards if s["split"] == "train"]
    assert len(train) > 1 and [h.count for h in module.train_tokens.headers] == train


# ------------------------------------------------------------------------------- commands and configs


def test_the_prepare_command_prepares_then_verifies(tmp_path, capsys):
    (tmp_path / "corpus.txt").write_text(random_text(13, 300))
    args = [
        "--data.source", "files",
        "--data.train_files", str(tmp_path / "corpus.txt"),
        "--data.cache_dir", str(tmp_path / "cache"),
    ]  # fmt: skip
    assert prepare_main(args) == 0
    assert "char tokenizer" in capsys.readouterr().out
    assert prepare_main([*args, "--verify"]) == 0
    assert "0 problems in " in capsys.readouterr().err
    assert prepare_main(["--data.source", "mqar"]) == 0
    assert "nothing to prepare" in capsys.readouterr().out


def test_the_tinystories_config_trains_offline_on_a_local_copy(tmp_path, capsys):
    """configs/tinystories.yaml streams the Hub dataset; here the same settings read record files
    the test writes (as a user without network would), at toy model size."""
    config = yaml.safe_load((REPO / "configs" / "tinystories.yaml").read_text())
    assert config["data"]["hf_name"] == "roneneldan/TinyStories" and config["data"]["tokenizer"] == "bpe"
    stories = [
        f"Once upon a time there was a {w} who liked to {v}."
        for w in ("cat", "dog", "girl")
        for v in ("run", "sing", "play", "read")
    ] * 8
    write_records(tmp_path / "train.parquet", stories)
    write_records(tmp_path / "validation.parquet", stories[:12])
    args = [
        "--config", str(REPO / "configs" / "tinystories.yaml"),
        "--data.hf_name", "parquet",
        "--data.hf_data_files", json.dumps({"train": str(tmp_path / "train.parquet"), "validation": str(tmp_path / "validation.parquet")}),
        "--data.bpe_vocab_size", "300",
        "--data.cache_dir", str(tmp_path / "cache"),
        "--data.batch_size", "2",
        "--data.val_batches", "1",
        "--data.num_workers", "0",
        "--model.n_layer", "1", "--model.n_head", "2", "--model.d_model", "16", "--model.block_size", "16",
        "--model.compile", "false",
        "--trainer.accelerator", "cpu", "--trainer.precision", "32",
        "--trainer.max_steps", "2", "--trainer.val_check_interval", "2",
        "--run.root", str(tmp_path / "runs"), "--run.sample_tokens", "5",
    ]  # fmt: skip
    assert prepare_main(args) == 0
    assert "bpe tokenizer (vocab 300)" in capsys.readouterr().out
    assert train_main(args) == 0
    assert "final val loss" in capsys.readouterr().out


def mapped_kb(path: Path) -> int:
    """Resident KB of this process's mappings of `path` (Linux's /proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[:1].isdigit() or line[:1] in "abcdef" and "-" in line.split()[0]:
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads Linux's /proc/self/smaps")
def test_random_windows_keep_no_pages_mapped(tmp_path, monkeypatch):
    """nanoGPT's issue 287: a long-lived memory map's touched pages count in the process's memory;
    here they are dropped as each window is read, however many windows a run draws. (The 6 MB of
    ids stand for a large corpus: arrays up to KEEP_MAPPED_BYTES keep their pages, below.)"""
    monkeypatch.setattr(shards_module, "KEEP_MAPPED_BYTES", 1 << 20)
    rng = random.Random(14)
    (tmp_path / "corpus.txt").write_text("".join(rng.choice("abcdefgh \n") for _ in range(3_000_000)))
    prepared = prepare(
        DataSettings(source="files", train_files=str(tmp_path / "corpus.txt"), cache_dir=str(tmp_path))
    )
    array = prepared.train
    starts = np.random.default_rng(0).integers(0, len(array) - 300, 3000)
    for start in starts[:10]:
        array.window(int(start), 257)
    assert mapped_kb(array.paths[0]) < 1024
    for start in starts:
        array.window(int(start), 257)
    assert mapped_kb(array.paths[0]) < 1024  # 3,000 windows would otherwise map most of the 6 MB
    # Evaluation's reads (positions of a batch of windows, through __getitem__) drop theirs too;
    # and so do a training run's batches, drawn by the data loader.
    windows = np.arange(0, 8 * 257, 257)[:, None] + np.arange(257)[None, :]  # 8 windows side by side
    for start in starts[::30] % (len(array) - windows.max() - 1):
        array[start + windows]
    assert mapped_kb(array.paths[0]) < 1024
    module = TextDataModule(
        source="files",
        train_files=str(tmp_path / "corpus.txt"),
        block_size=256,
        batch_size=32,
        cache_dir=str(tmp_path),
    )
    loader = iter(module.train_dataloader())
    for _ in range(100):
        next(loader)
    assert mapped_kb(module.train_tokens.paths[0]) < 1024


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads Linux's /proc/self/smaps")
def test_a_small_array_keeps_its_pages_and_reads_the_same_windows(tmp_path, monkeypatch):
    """Ids of at most KEEP_MAPPED_BYTES stay mapped (no unmapping and faulting in again at every
    batch): the resident set grows to the file's size at most; the windows are the same."""
    rng = random.Random(14)
    (tmp_path / "corpus.txt").write_text("".join(rng.choice("abcdefgh \n") for _ in range(3_000_000)))
    prepared = prepare(
        DataSettings(source="files", train_files=str(tmp_path / "corpus.txt"), cache_dir=str(tmp_path))
    )
    small = prepared.train
    assert small.keeps_pages and len(small) * 2 <= shards_module.KEEP_MAPPED_BYTES
    monkeypatch.setattr(shards_module, "KEEP_MAPPED_BYTES", 1 << 20)
    large = TokenArray(small.paths, small.vocab_size)
    assert not large.keeps_pages
    starts = np.random.default_rng(1).integers(0, len(small) - 300, 3000)
    for start in starts:
        assert np.array_equal(small.window(int(start), 257), large.window(int(start), 257))
    assert mapped_kb(small.paths[0]) > 2 * 1024  # the small array's pages: most of the 6 MB
    assert np.array_equal(small.windows(starts, 257), large.windows(starts, 257))


def test_a_batch_of_windows_equals_its_windows_one_by_one(tmp_path, tiny_pieces):
    """TokenArray.windows (a training batch): rows inside a shard read with one index, those
    across a shard's end piece by piece, the same ids either way; out of range and damaged ids
    refused as `window` refuses them."""
    (tmp_path / "corpus.txt").write_text(random_text(9, 500))
    settings = dict(source="files", train_files=str(tmp_path / "corpus.txt"), val_fraction=0.1)
    many = prepare(DataSettings(**settings, cache_dir=str(tmp_path / "many"), shard_tokens=333)).train
    assert len(many.paths) > 5
    starts = np.random.default_rng(0).integers(0, len(many) - 700, 50)
    starts[:3] = [0, 333 - 5, len(many) - 700]  # the first id, across a shard's end, the last window
    expected = np.stack([many.window(int(start), 700) for start in starts])
    assert np.array_equal(many.windows(starts, 700), expected)
    assert many.windows(starts[:0], 700).shape == (0, 700)
    with pytest.raises(IndexError):
        many.windows([0, len(many) - 10], 20)
    many.vocab_size = int(expected.max())  # the largest id is now outside the vocabulary
    with pytest.raises(shards_module.DamagedShard, match="prepare.py --verify"):
        many.windows(starts, 700)


def test_an_edited_tokenizer_json_prepares_the_data_again(tmp_path, capfd):
    text = random_text(15, 200)
    (tmp_path / "corpus.txt").write_text(text)
    tokenizer_file = tmp_path / "tokenizer.json"
    original = build_tokenizer("bpe", text, 300)
    original._tokenizer.save(str(tokenizer_file))
    settings = DataSettings(
        source="files",
        train_files=str(tmp_path / "corpus.txt"),
        val_fraction=0.1,
        tokenizer=str(tokenizer_file),
        cache_dir=str(tmp_path / "cache"),
    )
    first = prepare(settings)
    assert first.tokenizer.fingerprint() == original.fingerprint()
    other = build_tokenizer("bpe", text[:3000], 280)
    assert other.fingerprint() != original.fingerprint()
    other._tokenizer.save(str(tokenizer_file))
    capfd.readouterr()
    second = prepare(settings)
    err = capfd.readouterr().err
    assert str(tokenizer_file) in err and "preparing it again" in err and err.count("\n") == 1, err
    assert second.tokenizer.fingerprint() == other.fingerprint()
    both = np.concatenate([ids(second.train), ids(second.val)])
    assert np.array_equal(both, other.encode_corpus(text))
