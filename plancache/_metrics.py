"""Prometheus metrics of what plancache decides, through ``prometheus_client`` where it is
installed (vLLM depends on it), in its default registry: the registry vLLM's API server
serves at ``/metrics`` beside its own metrics. Worker processes' metrics reach it where
``PROMETHEUS_MULTIPROC_DIR`` is set (prometheus_client's multiprocess mode, which vLLM's
``get_prometheus_registry`` reads with a ``MultiProcessCollector``). Without
prometheus_client, or with ``PLANCACHE_METRICS=0``, every call does nothing. Never raises.

Metrics (labels):

- ``plancache_decisions_total`` (kind, result, model): one per decision: a plan's lookup
  (kind ``plans``), a compile artifact's fetch (``compile_artifact``), model info
  (``model_info``), a cache's bundles (``cache_<kind>``); result ``hit``, ``miss``,
  ``gate:...``, ``timeout``, ``store-error``, ``untrusted``, ``invalid``, ``slow``, ...
- ``plancache_decision_seconds`` (kind, result): a histogram of what each decision took.
- ``plancache_writes_total`` (kind, result): records and uploads (``created``,
  ``replaced``, ``kept``, or why nothing was written).
- ``plancache_seconds_saved_total`` (kind, model): per hit, what the producer recorded its
  work cost (a compile's ``compile_s``) minus what the hit took.
- ``plancache_seconds_lost_total`` (kind, model): time spent on fetches given up (``slow``,
  ``timeout``) before the node did the work itself.
- ``plancache_bytes_total`` (kind, direction): bytes installed (``fetched``) and stored
  (``uploaded``).
- ``plancache_store_request_seconds`` (scheme, op): a histogram of the remote store's calls.
- ``plancache_rebuilt_total`` (kind): things built anyway after shared ones were installed.
- ``plancache_left_out_total`` (kind, why): files an upload left out.

Besides, each process keeps a tally of its decisions and rebuilds (``tally``), whatever
``PLANCACHE_METRICS`` says: what a boot report stores (``plancache._artifacts.reports``).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Any

from plancache._defaults import METRICS
from plancache.errors import ConfigError

log = logging.getLogger("plancache")

SECONDS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
_lock = threading.Lock()
_made: dict[str, Any] | None = None
_off = False
_tally: dict[str, Counter[str]] = {}
"""Per kind: each decision's result, and ``rebuilt``."""
MAX_TALLIED = 64
"""Most kinds, and results of one kind, the tally keeps (the rest are not counted)."""


def _metrics() -> dict[str, Any] | None:
    """The metrics, created on first use; None where they are off or cannot be made."""
    global _made, _off
    if _made is not None or _off:
        return _made
    with _lock:
        if _made is not None or _off:
            return _made
        try:
            _off = not METRICS.read()
        except ConfigError:  # never raises: a malformed value leaves them on, as before
            _off = False
        if _off:
            return None
        try:
            import prometheus_client as p

            _made = {
                "decisions": p.Counter(
                    "plancache_decisions", "plancache decisions", ["kind", "result", "model"]
                ),
                "decision_seconds": p.Histogram(
                    "plancache_decision_seconds",
                    "seconds a plancache decision took",
                    ["kind", "result"],
                    buckets=SECONDS,
                ),
                "writes": p.Counter("plancache_writes", "plancache writes", ["kind", "result"]),
                "saved": p.Counter(
                    "plancache_seconds_saved", "seconds hits saved", ["kind", "model"]
                ),
                "lost": p.Counter(
                    "plancache_seconds_lost", "seconds fetches given up cost", ["kind", "model"]
                ),
                "bytes": p.Counter("plancache_bytes", "bytes moved", ["kind", "direction"]),
                "rebuilt": p.Counter(
                    "plancache_rebuilt", "built anyway after shared state was installed", ["kind"]
                ),
                "left_out": p.Counter(
                    "plancache_left_out", "files an upload left out", ["kind", "why"]
                ),
                "requests": p.Histogram(
                    "plancache_store_request_seconds",
                    "seconds of a remote store's calls",
                    ["scheme", "op"],
                    buckets=SECONDS,
                ),
            }
        except Exception as exc:  # not installed, or names taken in this registry
            log.debug("plancache: no metrics: %s: %s", type(exc).__name__, exc)
            _off = True
    return _made


def _safely(name: str, labels: dict[str, str], op: str, value: float) -> None:
    try:
        made = _metrics()
        if made is not None:
            getattr(made[name].labels(**labels), op)(value)
    except Exception as exc:  # a metric never breaks a boot
        log.debug("plancache: metric %s not updated: %s", name, exc)


def _count(kind: str, what: str, n: int) -> None:
    with _lock:
        counts = _tally.get(kind)
        if counts is None and len(_tally) < MAX_TALLIED:
            counts = _tally[kind] = Counter()
        if counts is not None and (what in counts or len(counts) < MAX_TALLIED):
            counts[what] += n


def tally() -> dict[str, dict[str, int]]:
    """What this process decided and rebuilt so far: {kind: {result or "rebuilt": count}}."""
    with _lock:
        return {kind: dict(counts) for kind, counts in _tally.items()}


def decision(kind: str, result: str, seconds: float, model: object = "") -> None:
    """Count a decision of ``kind`` and time it."""
    _count(kind, result, 1)
    model = str(model or "")
    _safely("decisions", {"kind": kind, "result": result, "model": model}, "inc", 1)
    _safely("decision_seconds", {"kind": kind, "result": result}, "observe", seconds)


def write(kind: str, result: str) -> None:
    """Count a record or an upload of ``kind`` and what became of it."""
    _safely("writes", {"kind": kind, "result": result}, "inc", 1)


def saved(kind: str, seconds: float, model: object = "") -> None:
    """Add what a hit saved (ignored unless positive)."""
    if seconds > 0:
        _safely("saved", {"kind": kind, "model": str(model or "")}, "inc", seconds)


def lost(kind: str, seconds: float, model: object = "") -> None:
    """Add what a fetch given up cost (ignored unless positive)."""
    if seconds > 0:
        _safely("lost", {"kind": kind, "model": str(model or "")}, "inc", seconds)


def moved(kind: str, direction: str, n: int) -> None:
    """Add ``n`` bytes ``fetched`` or ``uploaded``."""
    if n > 0:
        _safely("bytes", {"kind": kind, "direction": direction}, "inc", n)


def rebuilt(kind: str, n: int) -> None:
    """Count ``n`` things of ``kind`` a process built although it had installed shared ones
    (kernels compiled after a bundle was installed)."""
    if n > 0:
        _count(kind, "rebuilt", n)
        _safely("rebuilt", {"kind": kind}, "inc", n)


def left_out(kind: str, why: str, n: int) -> None:
    """Count ``n`` files an upload of ``kind`` left out, and why (``foreign``, ``odd``,
    ``deep``, ``name``, ``cap``)."""
    if n > 0:
        _safely("left_out", {"kind": kind, "why": why}, "inc", n)


def request(scheme: str, op: str, seconds: float) -> None:
    """Time one call of a remote store."""
    _safely("requests", {"scheme": scheme, "op": op}, "observe", seconds)
