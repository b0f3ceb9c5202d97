import os
import traceback
from collections.abc import Collection
from pathlib import Path

# Set (to anything but empty), an error raised in a kind of the user's own shows its whole traceback.
TRACEBACK_VARIABLE = "MINITX_TRACEBACK"


class UserError(ValueError):
    """A mistake in the user's input: shown as one line, exit status 2, no traceback."""


def one_line(error: BaseException | str, limit: int | None = None) -> str:
    """An exception's message (or a text) on one line, cut to `limit` characters if given."""
    text = " ".join(str(error).split()) or (type(error).__name__ if isinstance(error, BaseException) else "")
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."


def require(condition: bool, message: str) -> None:
    """A check of the user's input: the message (one line naming the setting and the fix) if not."""
    if not condition:
        raise UserError(message)


def raised_in(error: BaseException, files: Collection[str]) -> str | None:
    """'file:line: Type: message' for the innermost frame of error's traceback that lies in one of
    `files` (resolved paths), or None when no frame does (or TRACEBACK_VARIABLE asks for the whole)."""
    if os.environ.get(TRACEBACK_VARIABLE):
        return None
    frames = [
        f for f in traceback.extract_tb(error.__traceback__) if str(Path(f.filename).resolve()) in files
    ]
    if not frames:
        return None
    where = frames[-1]
    return f"{shown(where.filename)}:{where.lineno}: {type(error).__name__}: {one_line(error, 300)}"


def shown(path: str) -> str:
    """A path relative to the working directory when inside it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return path
