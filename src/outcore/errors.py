"""One exception type for every mistake a user can make.

`OutcoreError` subclasses ValueError so callers that catch ValueError keep working; the CLI
prints its message on one line (no traceback), so every message must say what is wrong and
how to fix it.
"""


class OutcoreError(ValueError):
    """A user-facing error: the message is one line saying what is wrong and what to do."""
