"""The rollout's front end, apart from what it judges: the store as the nodes see it
(``S3UnderLoad``) served by a process of its own, and the evidence that the simulation's own
parts kept up, second by second.

``Front`` runs the proxy in a spawned child process (its own interpreter lock and heap: in
the benchmark's main process it shared both with whatever the earlier stages left there).
The child samples, every ``SAMPLE_S``, the proxy's listen queue and the machine's busy CPU
seconds. ``loop_lags`` samples, in a worker process, how late its event loop (fsspec's, on
which every node of the process sends its requests) wakes up.

``evidence`` turns what both sides recorded into one row per second of the run (requests,
the store's answers, the harness's failures, the proxy's accept and answer latency and what
of it was the proxy's own and moto's, the listen queue, the clients' loop lag, the machine's
load) and one verdict on the harness:
it failed where a connection was not accepted (the kernel's count of connections dropped
from full listen queues while the run lasted: the proxy's or moto's, the run's listeners,
though the count is the machine's), lost an answer from moto, or held a request, a
connection or a client's loop longer than a client waits to connect (``HARNESS_BOUND_S``):
a client of a healthy store would then have given up on the harness, not on the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

from benchmarks import machine
from plancache.testing import servers

SAMPLE_S = 0.1
"""Seconds between two samples of the listen queue, the machine's CPU and a loop's lag."""
HARNESS_BOUND_S = 0.5
"""A client's connect timeout on S3 (plancache's default ``connect_timeout``): the harness
may hold a request, a connection or a client's event loop no longer than this."""
START_S = 60.0
"""Seconds the child process may take to start serving (or to answer a command)."""


def _listen_overflows() -> int | None:
    """Connections the kernel dropped from full listen queues, every listener of this
    machine together (``TcpExt: ListenOverflows``); None where it cannot be read."""
    try:
        with open("/proc/net/netstat") as f:
            lines = [line.split() for line in f if line.startswith("TcpExt:")]
        return int(dict(zip(lines[0], lines[1], strict=True))["ListenOverflows"])
    except (OSError, IndexError, KeyError, ValueError):
        return None


def _serve(conn: Any, upstream: str, load: dict[str, Any]) -> None:
    """The child: serve ``S3UnderLoad`` and answer ``Front``'s commands until ``stop``."""
    proxy = servers.S3UnderLoad(upstream, **load)
    proxy.start()
    samples: list[tuple[float, int | None, int | None, float | None]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(SAMPLE_S):
            queue = proxy.listen_queue()
            waiting, size = queue if queue is not None else (None, None)
            samples.append((time.monotonic(), waiting, size, machine.cpu_seconds()))

    threading.Thread(target=sample, name="front-sampler", daemon=True).start()
    conn.send(proxy.endpoint)
    while True:
        command, *args = conn.recv()
        if command == "overload":
            proxy.overload(*args)
            conn.send(None)
        elif command == "report":
            conn.send(
                {
                    "requests": proxy.requests,
                    "received_by_name": dict(proxy.received_by_name),
                    "throttled": proxy.throttled,
                    "exchanges": proxy.exchanges,
                    "accepted": proxy.accepted,
                    "samples": list(samples),
                    "listen_overflows": _listen_overflows(),
                }
            )
        else:
            stop.set()
            proxy.stop()
            conn.send(None)
            return


class Front:
    """``S3UnderLoad(upstream, **load)`` in a child process of its own, as a context
    manager: ``endpoint``, ``overload`` as the proxy's, ``report()`` what it recorded (see
    ``_serve``)."""

    def __init__(self, upstream: str, **load: Any) -> None:
        self.upstream, self.load = upstream, load
        self.endpoint = ""

    def __enter__(self) -> Front:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve, args=(child, self.upstream, self.load), name="front", daemon=True
        )
        self._proc.start()
        child.close()
        self.endpoint = self._call()
        self.overflows_before = _listen_overflows()
        return self

    def _call(self, *command: Any) -> Any:
        if command:
            self._conn.send(command)
        if not self._conn.poll(START_S):
            raise RuntimeError(f"the front end's process did not answer {command or 'start'}")
        return self._conn.recv()

    def overload(self, until: float, delay_s: float) -> None:
        self._call("overload", until, delay_s)

    def report(self) -> dict[str, Any]:
        """What the proxy recorded so far; ``listen_overflows`` counted since ``__enter__``."""
        found: dict[str, Any] = self._call("report")
        after, before = found["listen_overflows"], self.overflows_before
        found["listen_overflows"] = None if None in (after, before) else after - before
        return found

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError, EOFError, RuntimeError):
            self._call("stop")
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._conn.close()


def loop_lags(loop: asyncio.AbstractEventLoop, stop: threading.Event) -> Future[list[Any]]:
    """Sample, until ``stop``, how late ``loop`` wakes from a sleep of ``SAMPLE_S``:
    ``(time.monotonic(), seconds late)`` pairs, the future's result."""

    async def sample() -> list[tuple[float, float]]:
        lags = []
        while not stop.is_set():
            t = time.monotonic()
            await asyncio.sleep(SAMPLE_S)
            lags.append((t, time.monotonic() - t - SAMPLE_S))
        return lags

    return asyncio.run_coroutine_threadsafe(sample(), loop)


def _ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3, 1)


def _answer(outcome: int | str) -> str:
    """The column an exchange's outcome counts in."""
    if isinstance(outcome, str):
        return outcome
    if outcome == 503:
        return "503"
    return "ok" if outcome < 400 or outcome in (404, 412) else "error"


def evidence(
    front: dict[str, Any], lags: Iterable[tuple[float, float]], start: float
) -> dict[str, Any]:
    """Per second from ``start`` (``time.monotonic()`` of the window's opening): requests,
    the store's answers (``ok``: 2xx, 3xx, 404 and 412, the answers the protocol expects;
    ``503``; ``error``: any other), the harness's failures (``client-gone``,
    ``upstream-failed``, ``handler-failed``), the proxy's answer latency p50/max, the most
    of it the proxy itself held (beyond the designed delay and link, and moto) and moto, new
    connections and their accept wait max, the listen queue's peak, the clients' loop lag
    max and the machine's load; then ``harness``, the verdict (see the module)."""
    rows: dict[int, dict[str, Any]] = defaultdict(lambda: Counter())
    answer: dict[int, list[float]] = defaultdict(list)
    own: dict[int, list[float]] = defaultdict(list)
    moto: dict[int, list[float]] = defaultdict(list)
    waits: dict[int, list[float]] = defaultdict(list)
    for e in front["exchanges"]:
        s = int(e.at - start)
        rows[s]["requests"] += 1
        rows[s][_answer(e.outcome)] += 1
        answer[s].append(e.seconds)
        own[s].append(e.seconds - e.held - e.upstream)
        moto[s].append(e.upstream)
    for a in front["accepted"]:
        waits[int(a.at - start)].append(a.waited)
    queue: dict[int, int] = {}
    cpu: dict[int, tuple[float, float]] = {}
    for t, waiting, _, busy in front["samples"]:
        s = int(t - start)
        if waiting is not None:
            queue[s] = max(queue.get(s, 0), waiting)
        if busy is not None:
            cpu.setdefault(s, (t, busy))
    lag: dict[int, float] = {}
    for t, late in lags:
        lag[int(t - start)] = max(lag.get(int(t - start), 0.0), late)
    seconds = sorted(s for s in set(rows) | set(waits) | set(lag) | set(queue) if s >= 0)
    out = []
    for s in seconds:
        nxt = cpu.get(s + 1)
        load = None if s not in cpu or nxt is None else (nxt[1] - cpu[s][1]) / (nxt[0] - cpu[s][0])
        out.append(
            {
                "s": s,
                **rows[s],
                "answer_p50_ms": _ms(answer[s], 0.5),
                "answer_max_ms": _ms(answer[s], 1.0),
                "proxy_max_ms": _ms(own[s], 1.0),
                "moto_max_ms": _ms(moto[s], 1.0),
                "connections": len(waits[s]),
                "accept_max_ms": _ms(waits[s], 1.0),
                "queue_max": queue.get(s),
                "loop_lag_max_ms": None if s not in lag else round(lag[s] * 1e3, 1),
                "load": None if load is None else round(load, 2),
            }
        )
    return {"seconds": out, "harness": _verdict(front, out)}


def _verdict(front: dict[str, Any], seconds: list[dict[str, Any]]) -> dict[str, Any]:
    """The harness's failures over the run, and why it failed (empty: it kept up)."""
    sizes = [size for _, _, size, _ in front["samples"] if size is not None]
    peak = max((r["queue_max"] or 0 for r in seconds), default=0)
    counts = Counter(_answer(e.outcome) for e in front["exchanges"])

    def worst(key: str) -> float:
        return max((r[key] or 0.0 for r in seconds), default=0.0) / 1e3

    figures = {
        "answered": sum(n for k, n in counts.items() if k in ("ok", "503", "error")),
        "client_gone": counts[servers.CLIENT_GONE],
        "upstream_failed": counts[servers.UPSTREAM_FAILED],
        "handler_failed": counts[servers.HANDLER_FAILED],
        "listen_overflows": front["listen_overflows"],
        "listen_queue_peak": peak,
        "listen_queue_size": min(sizes) if sizes else None,
        "accept_max_s": worst("accept_max_ms"),
        "proxy_max_s": worst("proxy_max_ms"),
        "moto_max_s": worst("moto_max_ms"),
        "loop_lag_max_s": worst("loop_lag_max_ms"),
    }
    why = []
    if front["listen_overflows"]:  # the proxy's queue, or moto's behind it
        why.append(f"{front['listen_overflows']} connections not accepted (a listen queue full)")
    for key, what in (("upstream_failed", "answers lost by moto"), ("handler_failed", "")):
        if figures[key]:
            why.append(f"{figures[key]} {what or 'requests the proxy failed'}")
    for key, what in (
        ("accept_max_s", "a connection waited"),
        ("proxy_max_s", "the proxy held a request"),
        ("moto_max_s", "moto held a request"),
        ("loop_lag_max_s", "a client's event loop stalled"),
    ):
        if figures[key] > HARNESS_BOUND_S:
            why.append(f"{what} {figures[key]:.1f} s (> {HARNESS_BOUND_S} s)")
    return {**figures, "failed": why}
