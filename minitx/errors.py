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
