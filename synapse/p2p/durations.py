"""Durations as people write them: `30s`, `15m`, `12h`, `7d`, or bare seconds (`90`, `2.5`)."""

from __future__ import annotations

import math
import re

_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([smhd]?)\s*$", re.IGNORECASE)
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str | float) -> float:
    """Seconds in `text` (`30s`, `15m`, `12h`, `7d`; a bare number is seconds).

    Raises `ValueError` with a readable message for anything else, negatives included.
    """
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, int | float):
        value = float(text)
    else:
        match = _DURATION.match(text)
        if match is None:
            raise ValueError(
                f"not a duration: {text!r} (expected e.g. 30s, 15m, 12h, 7d or seconds)"
            )
        value = float(match.group(1)) * _UNIT[match.group(2).lower()]
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"not a duration: {text!r} (must be a finite, non-negative time)")
    return value


def format_duration(seconds: float) -> str:
    """The shortest exact spelling of `seconds` in the units `parse_duration` reads."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


__all__ = ["format_duration", "parse_duration"]
