"""A node script's report: one JSON line on stdout, written whole."""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def say(report: dict[str, Any]) -> None:
    """Write ``report`` as one JSON line in a single ``write`` to stdout's file (what was
    buffered is flushed first): a log line of another thread (a background upload's) can
    come before or after it, never inside it (``print`` writes the text and its newline
    apart). ``tests.vllm.support.outcomes`` reads the last such line."""
    sys.stdout.flush()
    data = (json.dumps(report) + "\n").encode()
    while data:
        data = data[os.write(sys.stdout.fileno(), data) :]
