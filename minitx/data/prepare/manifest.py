"""Stage 4, the directory: its key and fingerprint, the manifest, the lock, resuming, and checking."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minitx.data.shards import ShardError, ShardHeader, TokenArray, read_header, verify
from minitx.data.streams import path_fingerprint
from minitx.data.tokenizer import Tokenizer, tokenizer_from_dict
from minitx.errors import UserError, require
from minitx.files.atomic import TMP_PREFIX, read_json, write_json_atomically
from minitx.wording import counted

from .content import code_digest, file_digests, first_edited, library_version, stat_entries
from .settings import DECODE_ERRORS, PREPARED_FORMAT, DataSettings
from .source import Source, text_source
from .tokenise import _fit_tokenizer
from .writing import _encode, _NoRoom, _stat_shard, shards_of

# -------------------------------------------------------------------------------- the directory


def _key(identity: dict, tokenizer_identity: dict) -> str:
    """The directory's name: a hash of what decides its bytes, the code that writes them included
    (content.py), and nothing of where or when its files were written."""
    library = {} if tokenizer_identity["kind"] == "char" else {"tokenizers": library_version("tokenizers")}
    canonical = json.dumps(
        [PREPARED_FORMAT, code_digest(), identity, {**tokenizer_identity, **library}], sort_keys=True
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:20]


def _tokenizer_identity(settings: DataSettings) -> dict:
    kind, errors = settings.tokenizer, settings.decode_errors
    if kind == "char":
        return {"kind": "char", "decode_errors": errors}
    if kind == "bpe":  # "vocab_size": the key as it was named, so that prepared data stays found
        size, train_bytes = settings.bpe_vocab_size, settings.tokenizer_train_bytes
        return {"kind": "bpe", "vocab_size": size, "train_bytes": train_bytes, "decode_errors": errors}
    return {"kind": "file", "path": str(Path(os.path.expanduser(kind)).resolve()), "decode_errors": errors}


def _fingerprint(source: Source, settings: DataSettings) -> Any:
    """The source's fingerprint, with a tokenizer.json's when the tokenizer is one (editing the file
    prepares the data again, as editing the text does)."""
    found = source.fingerprint()
    tokenizer = _tokenizer_identity(settings)
    if tokenizer["kind"] != "file" or not os.path.isfile(tokenizer["path"]):
        return found  # a missing tokenizer.json is named when it is loaded
    stats = path_fingerprint([Path(tokenizer["path"])])
    return found + stats if isinstance(found, list) else {**found, "tokenizer_file": stats}


def cache_root(cache_dir: str | os.PathLike | None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(base).expanduser() / "minitx"


@dataclass
class Prepared:
    """A prepared dataset, opened: the tokenizer and each split's ids as one array over its shards."""

    directory: Path
    tokenizer: Tokenizer
    train: TokenArray
    val: TokenArray
    manifest: dict = field(repr=False)

    def text_size(self, split: str) -> tuple[int, int]:
        """(characters, bytes) of the text the split's ids spell."""
        info = self.manifest["splits"][split]
        return int(info["characters"]), int(info["bytes"])


def _checked_header(directory: Path, shard: dict) -> ShardHeader:
    """The header of a shard the manifest names, checked against it (cheap: a stat and the header);
    ShardError says why the shard cannot be used as it is."""
    path = directory / shard["file"]
    try:
        if _stat_shard(path) != {"size": shard["size"], "mtime_ns": shard["mtime_ns"]}:
            raise ShardError("its size or modification time is not the one recorded when it was written")
    except FileNotFoundError:
        raise ShardError("it is missing") from None
    header = read_header(path)
    if header.count != shard["tokens"] or header.crc32 != shard["crc32"]:
        raise ShardError("its header does not match the manifest")
    return header


def _open(directory: Path, manifest: dict, headers: dict[str, ShardHeader] | None = None) -> Prepared:
    """The prepared data of a manifest; `headers` (by file name), when given, are its shards'
    headers already read and checked, so that opening does not read them again."""
    tokenizer = tokenizer_from_dict(manifest["tokenizer"])
    arrays = {}
    for split in ("train", "val"):
        names = [shard["file"] for shard in shards_of(manifest) if shard["split"] == split]
        arrays[split] = TokenArray(
            [directory / name for name in names],
            vocab_size=tokenizer.vocab_size,
            headers=None if headers is None else [headers[name] for name in names],
        )
    return Prepared(directory, tokenizer, arrays["train"], arrays["val"], manifest)


@contextlib.contextmanager
def _locked(directory: Path, log: Callable[[str], None]) -> Iterator[None]:
    """One prepare of a dataset at a time; a second waits for the first and then uses its result."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.with_name(directory.name + ".lock"), "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            log(f"minitx: {directory} is being prepared by {holder}; waiting for it to finish")
            fcntl.flock(lock, fcntl.LOCK_EX)
        lock.seek(0)
        lock.truncate()
        lock.write(f"process {os.getpid()}")
        lock.flush()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def prepare(settings: DataSettings, log: Callable[[str], None] = _stderr, progress: bool = True) -> Prepared:
    """The prepared dataset for `settings`: opened at once when current, else (re)prepared first."""
    if settings.decode_errors not in DECODE_ERRORS:
        raise UserError(
            f"data.decode_errors: {settings.decode_errors!r} is not one of {', '.join(DECODE_ERRORS)}"
        )
    if settings.shard_tokens < 1:
        raise UserError(f"data.shard_tokens: must be at least 1, got {settings.shard_tokens}")
    if settings.max_tokens is not None and settings.max_tokens < 1:
        raise UserError(f"data.max_tokens: must be at least 1 (or unset for all), got {settings.max_tokens}")
    source = text_source(settings)
    key = _key({**source.identity, "max_tokens": settings.max_tokens}, _tokenizer_identity(settings))
    directory = cache_root(settings.cache_dir) / "prepared" / key
    fingerprint = _fingerprint(source, settings)
    opened = _open_current(directory, fingerprint, source)  # the fast path: no lock, nothing read but stats
    if opened is not None:
        return opened
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(
            f"data.cache_dir: cannot create {str(directory)!r} ({err.strerror}); set data.cache_dir to a writable directory"
        ) from None
    # Memory: the commands' allocator settings (allocator.py) keep freed blocks for reuse, and the
    # blocks here are a few batches' worth, reused batch after batch (measured: 570 MB peak RSS
    # for 1 GB; returning every block to the kernel cost 30% more time in page faults).
    with _locked(directory, log):
        opened = _open_current(directory, fingerprint, source)  # another process may have just finished it
        return opened or _prepare_locked(settings, source, directory, fingerprint, log, progress)


def _open_current(directory: Path, fingerprint: Any, source: Source) -> Prepared | None:
    manifest = read_json(directory / "manifest.json")
    if manifest is None or manifest.get("format") != PREPARED_FORMAT:
        return None
    if manifest.get("fingerprint") != fingerprint:
        # Only times changed (a copy, another checkout's or environment's install of the same
        # files)? Then the bytes decide: prepared from the same bytes, it is used as it is.
        if first_edited(manifest, fingerprint, source.paths) != (True, None):
            return None
        manifest = {**manifest, "fingerprint": fingerprint}
        with contextlib.suppress(OSError):  # a read-only cache is still used; the next start hashes again
            write_json_atomically(directory / "manifest.json", manifest)
    try:
        headers = {shard["file"]: _checked_header(directory, shard) for shard in shards_of(manifest)}
    except ShardError:
        return None  # the locked pass below says what and prepares again from that shard
    return _open(directory, manifest, headers)


def _changed(old: Any, new: Any) -> str:
    before, after = stat_entries(old) or {}, stat_entries(new) or {}
    for name, stats in after.items():
        if name not in before:
            return f"{name} is new"
        if before[name] != stats:
            return f"{name} has a new size or modification time"
    gone = [name for name in before if name not in after]
    return f"{gone[0]} is gone" if gone else "its fingerprint changed"


def _prepare_locked(
    settings: DataSettings, source: Source, directory: Path, fingerprint: Any, log, progress: bool
) -> Prepared:
    for stale in directory.glob(TMP_PREFIX + "*"):  # left by a prepare that was killed mid-shard
        stale.unlink(missing_ok=True)
    state = read_json(directory / "manifest.json") or read_json(directory / "progress.json")
    repaired = False  # a damaged shard was named: that one line also says where it goes on from
    if state is None and any(directory.glob("*.bin")):
        log(
            f"minitx: {directory} holds shards but no readable manifest.json or progress.json; preparing it again"
        )
    if state is not None and state.get("format") != PREPARED_FORMAT:
        state = None
    elif state is not None and state.get("fingerprint") != fingerprint:
        edited = first_edited(state, fingerprint, source.paths)[1]
        why = f"{edited} has new content" if edited else _changed(state.get("fingerprint"), fingerprint)
        log(f"minitx: {source.describe} changed since it was prepared ({why}); preparing it again")
        state = None
    elif state is not None:
        kept = []
        for checkpoint in state["checkpoints"]:
            try:
                for shard in checkpoint["shards"]:
                    _checked_header(directory, shard)
            except ShardError as error:
                log(
                    f"minitx: the shard {directory / shard['file']} cannot be used ({error}); preparing again from it"
                )
                repaired = True
                break
            kept.append(checkpoint)
        state = {**state, "checkpoints": kept}
        # Shards no checkpoint names: finished and renamed just before a kill, or after a damaged
        # one. The resumed prepare writes them again.
        named = {shard["file"] for shard in shards_of(state)}
        for orphan in directory.glob("*.bin"):
            if orphan.name not in named:
                orphan.unlink()
    if state is None:
        for entry in directory.iterdir():
            entry.unlink() if entry.is_file() else shutil.rmtree(entry)
        tokenizer = _fit_tokenizer(settings, source, log)
        state = {
            "format": PREPARED_FORMAT,
            "identity": source.identity,
            "settings": {"tokenizer": settings.tokenizer, "max_tokens": settings.max_tokens},
            "fingerprint": fingerprint,
            "tokenizer": tokenizer.to_dict(),
            "checkpoints": [],
            "replaced_bytes": 0,
        }
    else:
        (directory / "manifest.json").unlink(missing_ok=True)
        tokenizer = tokenizer_from_dict(state["tokenizer"])
    write_json_atomically(directory / "progress.json", state)
    if state["checkpoints"] and not repaired:
        tokens = sum(shard["tokens"] for shard in shards_of(state))
        log(f"minitx: resuming the prepare of {directory} after its finished shards ({tokens:,} tokens)")
    try:
        _encode(settings, source, directory, tokenizer, state, log, progress)
    except _NoRoom:
        raise
    except UserError:
        # Bad input (invalid UTF-8, a file changed under us): nothing of this attempt is kept.
        shutil.rmtree(directory, ignore_errors=True)
        raise
    # Hashed before the stats are taken again: a file changed while it is read is named below.
    content = file_digests(fingerprint, source.paths)
    if (now := _fingerprint(source, settings)) != fingerprint:
        shutil.rmtree(directory, ignore_errors=True)
        raise UserError(
            f"{source.describe}: {_changed(fingerprint, now)} while it was being prepared; "
            "run again once it is complete"
        )
    manifest = {**_finish_manifest(state, source), "content": content}
    write_json_atomically(directory / "manifest.json", manifest)
    (directory / "progress.json").unlink(missing_ok=True)
    return _open(directory, manifest)


def _finish_manifest(state: dict, source: Source) -> dict:
    splits = {}
    for split in ("train", "val"):
        shards = [shard for shard in shards_of(state) if shard["split"] == split]
        splits[split] = {key: sum(s[key] for s in shards) for key in ("tokens", "bytes", "characters")}
        splits[split]["shards"] = len(shards)
    require(splits["val"]["tokens"] > 0, f"data: the validation set is empty; {source.val_hint}")
    return {**state, "splits": splits}


# -------------------------------------------------------------------------------- checking


def verify_prepared(prepared: Prepared, log: Callable[[str], None] = _stderr) -> list[str]:
    """Every shard's checksum and ids against the manifest: the problems found (none: all good)."""
    problems = []
    shards = shards_of(prepared.manifest)
    for shard in shards:
        path = prepared.directory / shard["file"]
        try:
            header = verify(path, prepared.tokenizer.vocab_size)
            if header.crc32 != shard["crc32"] or header.count != shard["tokens"]:
                raise ShardError("its header does not match the manifest")
        except ShardError as error:
            problems.append(f"{path}: {error}")
    for problem in problems:
        log(f"verify: {problem}")
    log(f"verify: {counted(len(problems), 'problem')} in {counted(len(shards), 'shard')}")
    return problems
