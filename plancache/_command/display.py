"""How the ``plancache`` command shows things to people: counts, sizes, ages, tables and a
progress bar. Nothing here reads a store.

Every line of text goes out through ``echo`` or ``print_table``, which show characters that
are not printable (terminal controls in a label, a producer or an endpoint's message) as
escapes (``printable``); JSON output escapes control characters as JSON does."""

from __future__ import annotations

import sys
import time
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import TextIO

import orjson

from plancache._redaction import printable as printable  # the command's escapes, named here too

PROGRESS_MIN = 20
"""Work on more items than this shows a progress bar."""


def echo(line: str = "", *, file: TextIO | None = None) -> None:
    """Print ``line``, ``printable`` (a newline in it too: it stays one line), on stdout
    unless ``file`` is given."""
    print(printable(line), file=sys.stdout if file is None else file)


def plural(count: int, noun: str) -> str:
    """``1 plan``, ``2 plans``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def age(seconds: float) -> str:
    """``45s``, ``12m``, ``5h``, ``30d``: the largest whole unit (``future`` if negative)."""
    if seconds < 0:
        return "future"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def when(ts: float, now: float) -> str:
    """``2024-05-01 12:00:00 UTC (3d ago)``, or ``(3d ahead)`` for a time after ``now``."""
    stamp = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{stamp} ({age(now - ts)} ago)" if ts <= now else f"{stamp} ({age(ts - now)} ahead)"


def size(n: int) -> str:
    """Bytes in the largest binary unit up to GiB, one decimal: ``512 B``, ``1.5 KiB``."""
    if n < 1024:
        return f"{n} B"
    value = n / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def print_json(data: object) -> None:
    """``data`` (dataclasses included) as indented JSON on stdout."""
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")


def table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], right: Collection[int]
) -> list[str]:
    """Aligned columns, each cell ``printable``; the columns in ``right`` are right-aligned
    (numbers)."""
    lines = [[printable(c) for c in row] for row in [headers, *rows]]
    widths = [max(len(r[i]) for r in lines) for i in range(len(headers))]
    return [
        "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in lines
    ]


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], right: Collection[int]
) -> None:
    """``table`` on stdout."""
    for line in table(headers, rows, right):
        print(line)


class Progress:
    """A one-line progress bar for more than ``PROGRESS_MIN`` items, redrawn at most every
    0.1 s and always at the end."""

    def __init__(self, stream: TextIO, label: str) -> None:
        self.stream, self.label = stream, label
        self._last = 0.0

    def update(self, done: int, total: int) -> None:
        """Show ``done`` of ``total``."""
        now = time.monotonic()
        if total <= PROGRESS_MIN or (done < total and now - self._last < 0.1):
            return
        self._last = now
        filled = 30 * done // total
        bar = "#" * filled + "." * (30 - filled)
        end = "\n" if done == total else ""
        self.stream.write(f"\r{self.label} [{bar}] {done}/{total}{end}")
        self.stream.flush()
