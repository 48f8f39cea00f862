"""A spawned worker's user-facing error, raised again in the parent as itself.

torch.multiprocessing.spawn turns whatever a child raises into a ProcessRaisedException
that holds the child's traceback as text. For outcore's own one-line errors (an
OutcoreError, or a ValueError/TypeError that outcore's checks raise) the child also
pickles the exception to a file beside the spawn's data, and the parent raises that
instead: the same type and message the single-process path gives. Anything else (a bug,
a torch or numpy failure) keeps torch's exception with the child's full traceback.
"""

from __future__ import annotations

import os
import pickle
import traceback

from ..errors import OutcoreError

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # .../outcore


def user_facing(exc: BaseException) -> bool:
    """An OutcoreError, or a ValueError/TypeError raised by a `raise` statement in outcore
    (a check), not one from inside numpy or torch, nor one an operator in outcore hit."""
    if isinstance(exc, OutcoreError):
        return True
    if type(exc) not in (ValueError, TypeError) or exc.__traceback__ is None:
        return False
    where = traceback.extract_tb(exc.__traceback__)[-1]      # the innermost frame
    inside = os.path.abspath(where.filename).startswith(_PACKAGE + os.sep)
    return inside and (where.line or "").lstrip().startswith("raise ")


def save(exc: BaseException, path: str) -> None:
    """In the child: keep a user-facing exc for the parent (anything else: nothing)."""
    if not user_facing(exc):
        return
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)                  # an exception that cannot be rebuilt: keep none
    except Exception:
        return
    with open(path, "wb") as f:
        f.write(data)


def load(paths: list[str], first: int | None) -> BaseException | None:
    """In the parent, after the spawn failed: the exception saved by rank `first` (the
    one torch reports), else by the lowest rank that saved one; None if no rank did."""
    order = ([first] if first is not None else []) + list(range(len(paths)))
    for r in order:
        if not (0 <= r < len(paths) and os.path.exists(paths[r])):
            continue
        try:
            with open(paths[r], "rb") as f:
                return pickle.load(f)
        except Exception:                   # unreadable: torch's exception tells instead
            continue
    return None
