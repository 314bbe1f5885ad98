"""Sizes in GiB, for tables and log lines alike (pure)."""

from __future__ import annotations

GiB = 1 << 30
"""Bytes in a gibibyte."""


def gib(n: int) -> str:
    """Bytes as GiB with two decimals, without the unit: ``10.00``."""
    return f"{n / GiB:.2f}"


def gib_text(value: object) -> str:
    """``value`` bytes as ``10.00GiB`` for a log line; anything but an int that fits 64 bits
    (a caller's value, unchecked) as its ``repr``, cut to 40 characters."""
    if type(value) is int and abs(value) < 2**63:
        return f"{gib(value)}GiB"
    return f"{value!r:.40}"
