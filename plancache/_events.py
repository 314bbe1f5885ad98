"""Every decision as a structured event: a logging record with fields, and a JSON line.

Each decision of every kind (a plan's lookup, a fetch of compile artifacts, cache bundles or
model info) is counted (``_metrics.decision``) and emitted here as one record on the
``plancache.events`` logger (level INFO, not propagated to ``plancache``'s text log): its
fields are ``record.plancache_event``, a dict of JSON values, and its message is that dict
as one JSON object. The vLLM plugin adds one ``boot`` event per rank (what the boot did).

Fields of every event: ``event`` (``decision`` or ``boot``), ``kind`` (``plans``,
``compile_artifact``, ``cache_<kind>``, ``model_info``), ``reason`` (a ``Reason`` value);
then the event's own: ``seconds`` and ``model`` for a decision, ``rank``, ``applied``,
``provisional`` and ``fingerprint`` for a boot.

With ``PLANCACHE_EVENTS=1``, every process writes each event to standard error as one line,
``plancache-event `` and the JSON object (``PREFIX``): what a program reads from a child it
started (the benchmarks read vLLM's boots so), in place of the text of log lines. Emitting
never raises and never blocks on anything but the handlers.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from typing import Any

from plancache import _metrics as metrics
from plancache._defaults import EVENTS

LOGGER = "plancache.events"
PREFIX = "plancache-event "
"""What starts each event's line on standard error (``PLANCACHE_EVENTS=1``)."""

log = logging.getLogger(LOGGER)
log.setLevel(logging.INFO)
log.propagate = False


@functools.cache
def _to_stderr() -> None:
    """Once per process: where ``PLANCACHE_EVENTS`` is on, a handler writing each event's
    line to standard error (a malformed value: off, said once on the ``plancache`` log)."""
    try:
        on = EVENTS.read(os.environ)
    except ValueError as exc:
        logging.getLogger("plancache").warning("plancache: events not written: %s", exc)
        return
    if on:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(PREFIX + "%(message)s"))
        log.addHandler(handler)


def emit(event: str, kind: str, reason: str, **fields: Any) -> None:
    """One event (see the module docstring); never raises."""
    try:
        _to_stderr()
        payload = {"event": event, "kind": kind, "reason": str(reason), **fields}
        line = json.dumps(payload, separators=(",", ":"), default=str)
        log.info("%s", line, extra={"plancache_event": payload})
    except Exception:  # an event never breaks a decision
        return


def decision(kind: str, reason: str, seconds: float, model: object = "") -> None:
    """Count one decision of ``kind`` (``_metrics.decision``) and emit it."""
    metrics.decision(kind, str(reason), seconds, model)
    emit("decision", kind, reason, seconds=round(seconds, 6), model=str(model or ""))


def read(text: str) -> list[dict[str, Any]]:
    """The events in ``text`` (a child's standard error and output): each line starting
    with ``PREFIX`` decoded; a line that does not decode to an object is skipped."""
    out = []
    for line in text.splitlines():
        if line.startswith(PREFIX):
            try:
                got = json.loads(line[len(PREFIX) :])
            except ValueError:
                continue
            if isinstance(got, dict):
                out.append(got)
    return out
