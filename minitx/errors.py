class UserError(ValueError):
    """A mistake in the user's input: shown as one line, exit status 2, no traceback."""
