"""Byte sizes: parse "16GiB" / "512MB" / 1e9, and print them back."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from fractions import Fraction

from .errors import OutcoreError

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
# ASCII digits only (Python's \d and \s also match other scripts'); a sign is read so that
# "-1GiB" is told it must be positive rather than that it does not parse.
_PATTERN = re.compile(r"^[ \t\n\r]*([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)"
                      r"[ \t\n\r]*([a-zA-Z]*)[ \t\n\r]*$")


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
        if int(value) <= 0:   # 0.5 would be 0 bytes
            raise OutcoreError(f"{what}={value!r} is less than one byte: give a whole number "
                               "of bytes or a string such as '16GiB'")
        return int(value)
    m = _PATTERN.match(str(value))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise OutcoreError(
            f"{what}={value!r} does not parse as a size: write a number and a unit such as "
            "'16GiB', '512MiB', '24GB' or a plain byte count")
    # Exact (Fraction), not float: "1.001KB" is 1001 bytes, and a 17+ digit byte count
    # stays exact. The exponent is bounded first (as float's range did) so that "1e999999999"
    # is refused at once instead of building a billion-digit integer.
    x = Decimal(m.group(1))
    if not x > 0:
        raise OutcoreError(f"{what}={value!r} must be a positive size")
    if x.adjusted() > 300:
        raise OutcoreError(f"{what}={value!r} must be a positive, finite size")
    n = int(Fraction(x) * _UNITS[unit]) if x.adjusted() > -30 else 0
    if n <= 0:
        raise OutcoreError(f"{what}={value!r} is less than one byte: give a size of at least "
                           "1 byte, such as '16GiB'")
    return n


def fmt_bytes(n: float) -> str:
    """25769803776 -> '24.0 GiB'."""
    if isinstance(n, float) and not math.isfinite(n):
        return f"{n} B"   # nan / inf: int(nan) would raise inside an error message
    if abs(n) < 1024:
        return f"{int(n)} B"
    for unit, scale in (("KiB", 1024), ("MiB", 1024**2), ("GiB", 1024**3), ("TiB", 1024**4)):
        # rounded as printed: 1048575 is '1.0 MiB', not '1024.0 KiB'
        if unit == "TiB" or round(abs(n) / scale, 1) < 1024:
            return f"{n / scale:.1f} {unit}"
