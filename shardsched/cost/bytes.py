"""Sizes on the command line: '40GiB', '512MiB', '1.5GB', '4096'."""
from __future__ import annotations

import re
from fractions import Fraction

from shardsched.errors import UsageError

_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
MAX_BYTES = 2**63 - 1
"""The largest size a plan file holds (its integers are int64: `_json.loads_strict`)."""
BYTES_FORMS = ("accepted: a byte count (e.g. 1073741824) or a number with B, KiB, MiB, GiB, TiB, "
               "KB, MB, GB or TB (e.g. 2GiB, 512MiB), at most 2**63-1 bytes (8 EiB)")


def parse_bytes(text: str) -> int:
    """'2GiB' -> 2147483648; UsageError naming the accepted forms otherwise."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise UsageError(f"bad size {text!r}; {BYTES_FORMS}")
    value = int(Fraction(m.group(1)) * _UNITS[unit])  # exact: a float of 400 digits is inf
    if value <= 0:
        raise UsageError(f"size {text!r} must be positive; {BYTES_FORMS}")
    if value > MAX_BYTES:  # else workers start and the plan they write is refused
        raise UsageError(f"size {text!r} is too large; {BYTES_FORMS}")
    return value
