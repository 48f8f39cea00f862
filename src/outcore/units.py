"""Byte sizes: parse "16GiB" / "512MB" / 1e9, and print them back."""

from __future__ import annotations

import re

from .errors import OutcoreError

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: str | int | float | None, what: str = "size") -> int | None:
    """"24GiB" -> 25769803776; ints pass through; None stays None.

    Raises OutcoreError with the accepted forms when the string does not parse.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise OutcoreError(f"{what}={value!r} is not a size: give bytes or a string like '16GiB'")
    if isinstance(value, (int, float)):
        if not value > 0 or value == float("inf"):   # nan fails both comparisons
            raise OutcoreError(f"{what}={value!r} must be a positive, finite number of bytes")
        return int(value)
    m = _PATTERN.match(str(value))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise OutcoreError(
            f"{what}={value!r} does not parse as a size: write a number and a unit such as "
            "'16GiB', '512MiB', '24GB' or a plain byte count")
    x = float(m.group(1)) * _UNITS[unit]
    if not 0 < x < float("inf"):
        raise OutcoreError(f"{what}={value!r} must be a positive, finite size")
    n = int(x)
    if n <= 0:
        raise OutcoreError(f"{what}={value!r} must be positive")
    return n


def fmt_bytes(n: float) -> str:
    """25769803776 -> '24.0 GiB'."""
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"
