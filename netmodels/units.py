"""Parse human-written sizes, bandwidths and times ("1MiB", "50GBps", "400Gbps", "500ns") into base units."""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

from xsim.netmodels.errors import UnitError

# Decimal (SI) and binary (IEC) prefixes, as the IEC 80000-13 standard names them.
_SIZE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}

# Bandwidth suffixes -> bytes per second. "GBps"/"GB/s" are bytes (1e9), "Gbps"/"Gb/s" bits (1e9 / 8).
_BW_UNITS: dict[str, float] = {
    "Bps": 1.0,
    "KBps": 1e3,
    "MBps": 1e6,
    "GBps": 1e9,
    "TBps": 1e12,
    "bps": 1 / 8,
    "Kbps": 1e3 / 8,
    "Mbps": 1e6 / 8,
    "Gbps": 1e9 / 8,
    "Tbps": 1e12 / 8,
    "GiBps": float(2**30),
}

_TIME_UNITS: dict[str, float] = {"ns": 1.0, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9}

# Decimal digits a size's number may have before its unit: checked before the exact conversion, so "1e999999"
# is refused at once rather than built as a million-digit integer (2^63 bytes has 19 digits).
_MAX_SIZE_DIGITS = 30
_NUM = r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"


def parse_size(text: str | int) -> int:
    """Parse a byte count such as 1048576, "1MiB", "16MB" or "2GiB" into an integer number of bytes."""
    if isinstance(text, int):
        if text < 0:
            raise UnitError(f"size must not be negative, got {text}")
        return text
    m = re.fullmatch(_NUM + r"\s*([A-Za-z]*)", str(text).strip())
    if not m or m.group(2) not in _SIZE_UNITS:
        raise UnitError(f"cannot parse size {text!r} (examples: 1048576, 64KiB, 1MiB, 16MB, 2GiB)")
    # Exact decimal arithmetic: through a float, 9007199254740993 became ...992 (53-bit mantissa, issue 31).
    number = Decimal(m.group(1))
    if number and number.adjusted() > _MAX_SIZE_DIGITS:
        raise UnitError(f"size {text!r} is too large (more than {_MAX_SIZE_DIGITS} digits of bytes)")
    if number and (number.adjusted() < -_MAX_SIZE_DIGITS or len(number.as_tuple().digits) > _MAX_SIZE_DIGITS):
        # Below 10^-30 times the largest unit (2^40 < 10^13) no size is whole; neither is one with more
        # significant digits than a whole size up to 10^30 can have after the point.
        raise UnitError(f"size {text!r} is not a whole number of bytes")
    value = Fraction(number) * _SIZE_UNITS[m.group(2)]
    if value.denominator != 1:
        raise UnitError(f"size {text!r} is not a whole number of bytes")
    return int(value)


def parse_bandwidth(text: str | float) -> float:
    """Parse a bandwidth text with its unit ("50GBps", "50GB/s", "400Gbps") or a number (bytes/s) into bytes/s.

    Text without a unit is refused: "ring:2:50:0ns" meant 50 GB/s or 50 Gb/s, never 50 bytes/s (issue 13:
    it replayed a 1 GB transfer as 231 days). A number (from code or JSON) is bytes/s.
    """
    if isinstance(text, int | float):
        value = float(text)
    else:
        s = str(text).strip().replace("/s", "ps")
        m = re.fullmatch(_NUM + r"\s*([A-Za-z]*)", s)
        if not m or (m.group(2) and m.group(2) not in _BW_UNITS):
            raise UnitError(f"cannot parse bandwidth {text!r} (examples: 50GBps, 50GB/s, 400Gbps)")
        if not m.group(2):
            raise UnitError(
                f"bandwidth {text!r} has no unit: write {m.group(1)}GBps (bytes/s) or {m.group(1)}Gbps (bits/s)"
            )
        value = float(m.group(1)) * _BW_UNITS[m.group(2)]
    if not value > 0:
        raise UnitError(f"bandwidth must be positive, got {text!r}")
    return value


def parse_time_ns(text: str | float) -> float:
    """Parse a latency such as "500ns", "1.5us", "3us" or a bare number (ns) into nanoseconds (float)."""
    if isinstance(text, int | float):
        value = float(text)
    else:
        m = re.fullmatch(_NUM + r"\s*([a-zµ]*)", str(text).strip())
        if not m or (m.group(2) and m.group(2) not in _TIME_UNITS):
            raise UnitError(f"cannot parse time {text!r} (examples: 500ns, 1.5us, 3ms, 0)")
        value = float(m.group(1)) * (_TIME_UNITS[m.group(2)] if m.group(2) else 1.0)
    if value < 0:
        raise UnitError(f"latency must not be negative, got {text!r}")
    return value
