"""The conformance probe: does a store honour the preconditions of conditional writes?

Every guarantee of ``PlanStore.put_merged`` and ``rewrite`` (no lost observation, no lost
tombstone) rests on two primitives: create-if-absent and compare-and-swap. Some stores (and
proxies in front of them) accept such a write unconditionally, answering success and
overwriting. ``probe(store)`` finds out with the object layer only (``write_object``
create-if-absent and if-version-matches, ``read_object``, ``delete_object``), so it works on
every backend, on fresh random names of ``store`` (give it a store scoped to a probe
prefix: ``RemoteStore.probe_store``):

1. ``create``: create-if-absent on a fresh key succeeds;
2. ``create-existing``: the same create fails, and the object keeps its first content;
3. ``cas-missing``: a compare-and-swap on a missing key fails (and leaves it absent: step 4
   finds it absent);
4. ``concurrent-create``: ``RACERS`` concurrent creates of that key: exactly one wins, and its
   content is what is stored;
5. ``cas-wrong-version``: a compare-and-swap with another object's version fails and leaves
   the object unchanged;
   ``stream-create-existing``, run beside steps 1-5 on a key of its own: a create of an
   existing key with over one part (``PART_BYTES``: the path compile artifacts take, an S3
   multipart upload completed with ``If-None-Match``, a GCS resumable upload with
   ``ifGenerationMatch``) fails and leaves the object unchanged. Where it cannot finish
   (the time bound, a failed request) it decides nothing: a slow link is no lie;
6. ``cleanup``: the probe keys are deleted (its failures decide nothing).

That is ``CHECK_REQUESTS`` (17) primitive calls, plus one delete per key (3), the deletes
at once. Verdicts:
``HONEST``; ``LIES`` only on evidence that a precondition was ignored (a write that should
have failed succeeded, or stored content changed); ``READ_ONLY`` when the credentials may
not write (HTTP 403): nothing to judge; ``UNKNOWN`` after a transient failure (timeout,
5xx), an ambiguous answer or the deadline: no verdict, try again later. (This module does no
I/O of its own; ``plancache._backends.guarded`` runs it and keeps verdicts.)
"""

from __future__ import annotations

import enum
import functools
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from plancache import _background as background
from plancache._defaults import PROBE_TIMEOUT_S, STREAM_MIN_S
from plancache._keys import plan_object_name
from plancache._objects import CREATE, PART_BYTES, ObjectLayer, Update
from plancache._store import READ_LIMIT
from plancache.errors import PlancacheError, PlanStoreError, PlanStorePermissionError

T = TypeVar("T")

RACERS = 8
"""Concurrent creates of one fresh key in step 4."""
CHECK_REQUESTS = 9 + RACERS
"""Primitive calls of steps 1-5 and ``stream-create-existing`` when every one passes (cleanup
adds one delete per key)."""
PROBE_CALLS = CHECK_REQUESTS + 3
"""Most primitive calls of a probe: the checks and one delete per key."""

STEPS = {
    "create": "create-if-absent on a fresh key succeeds",
    "create-existing": "the same create fails and leaves the object unchanged",
    "cas-missing": "compare-and-swap on a missing key fails and leaves it absent",
    "concurrent-create": f"{RACERS} concurrent creates of a fresh key: exactly one wins",
    "cas-wrong-version": "compare-and-swap with a wrong version fails, object unchanged",
    "stream-create-existing": "a create of over one part (multipart, resumable) of an "
    "existing key fails, object unchanged",
    "cleanup": "the probe keys are deleted",
}
"""Each step's name and what it checks, in order."""


class StoreVerdict(enum.Enum):
    """What a probe found."""

    HONEST = "honest"
    """Every precondition held."""
    LIES = "lies"
    """A precondition was ignored: the store must not be written."""
    READ_ONLY = "read-only"
    """The credentials may not write (nothing to judge)."""
    UNKNOWN = "unknown"
    """A transient failure or an ambiguous answer: no verdict."""


@dataclass(frozen=True)
class Step:
    """One step of a probe: ``ok`` is None where it did not run (or decided nothing)."""

    name: str
    ok: bool | None
    detail: str = ""


@dataclass(frozen=True)
class ProbeResult:
    """A probe's verdict, the step that decided it (None for ``HONEST``) and why."""

    verdict: StoreVerdict
    step: str | None
    detail: str
    steps: tuple[Step, ...] = ()
    requests: int = 0
    seconds: float = 0.0


class _Decided(PlancacheError):
    """Ends a probe early with a verdict."""

    def __init__(self, verdict: StoreVerdict, step: str, detail: str) -> None:
        super().__init__(detail)
        self.verdict, self.step, self.detail = verdict, step, detail


@dataclass
class _Run:
    store: ObjectLayer
    deadline: float
    token: str = field(default_factory=lambda: secrets.token_hex(8))
    steps: list[Step] = field(default_factory=list)
    requests: int = 0
    written: list[str] = field(default_factory=list)
    unreachable: bool = False
    denied: bool = False

    def data(self, label: str) -> bytes:
        return f'{{"plancache-probe":"{self.token}","write":"{label}"}}'.encode()

    def key(self) -> str:
        """A fresh object name (named as a plan is, so that stores keep it like one)."""
        key = plan_object_name(secrets.token_hex(32))
        self.written.append(key)
        return key

    def create(self, name: str, data: bytes) -> bool:
        return self.store.write_object(name, (data,), CREATE)

    def create_streamed(self, name: str) -> bool:
        """A create of just over one part, in two chunks."""
        return self.store.write_object(name, (self.data("stream"), b" " * PART_BYTES), CREATE)

    def replace(self, name: str, data: bytes, version: object) -> bool:
        return self.store.write_object(name, (data,), Update(version))

    def read(self, name: str) -> tuple[bytes, object] | None:
        return self.store.read_object(name, READ_LIMIT)

    def call(self, step: str, fn: Callable[[], T], *, writes: bool = False) -> T:
        """``fn()`` (one request), its store errors turned into a decision."""
        if time.monotonic() > self.deadline:
            raise _Decided(StoreVerdict.UNKNOWN, step, "the probe ran past its deadline")
        self.requests += 1
        try:
            return fn()
        except PlanStorePermissionError as exc:
            self.denied = True
            verdict = StoreVerdict.READ_ONLY if writes else StoreVerdict.UNKNOWN
            raise _Decided(verdict, step, str(exc)) from exc
        except PlanStoreError as exc:
            self.unreachable = True
            raise _Decided(StoreVerdict.UNKNOWN, step, str(exc)) from exc

    def passed(self, step: str, detail: str = "") -> None:
        self.steps.append(Step(step, True, detail))

    def race(self, key: str) -> list[int]:
        """Step 4's creates, started together; the indices of those that won."""
        step = "concurrent-create"
        results: list[bool | _Decided | None] = [None] * RACERS
        barrier = threading.Barrier(RACERS)

        def racer(i: int) -> None:
            try:
                barrier.wait(timeout=max(0.0, self.deadline - time.monotonic()))
                results[i] = self.create(key, self.data(f"racer-{i}"))
            except threading.BrokenBarrierError:
                results[i] = _Decided(StoreVerdict.UNKNOWN, step, "the racers did not start")
            except PlanStorePermissionError as exc:
                self.denied = True
                results[i] = _Decided(StoreVerdict.READ_ONLY, step, str(exc))
            except PlanStoreError as exc:
                self.unreachable = True
                results[i] = _Decided(StoreVerdict.UNKNOWN, step, str(exc))

        self.requests += RACERS
        jobs = [
            background.start(functools.partial(racer, i), "plancache-probe") for i in range(RACERS)
        ]
        for job in jobs:
            job.join(self.deadline - time.monotonic())
        for r in results:
            if isinstance(r, _Decided):
                raise r
            if r is None:
                raise _Decided(
                    StoreVerdict.UNKNOWN, step, "a create did not return before the deadline"
                )
        return [i for i, won in enumerate(results) if won]

    def checks(self) -> None:
        """Steps 1-5; raises ``_Decided`` unless every one passed."""
        k1 = self.key()
        first = self.data("first")
        if not self.call("create", lambda: self.create(k1, first), writes=True):
            raise _Decided(StoreVerdict.UNKNOWN, "create", "a create of a fresh key failed")
        self.passed("create")

        step = "create-existing"
        if self.call(step, lambda: self.create(k1, self.data("second")), writes=True):
            raise _Decided(StoreVerdict.LIES, step, "a create of an existing key succeeded")
        found = self.call(step, lambda: self.read(k1))
        if found is None:
            raise _Decided(StoreVerdict.UNKNOWN, step, "the object just created is missing")
        if found[0] != first:
            raise _Decided(StoreVerdict.LIES, step, "a failed create overwrote the object")
        version = found[1]
        self.passed(step)

        step = "cas-missing"
        k2 = self.key()
        orphan = self.data("cas-missing")
        if self.call(step, lambda: self.replace(k2, orphan, version), writes=True):
            raise _Decided(StoreVerdict.LIES, step, "a compare-and-swap on a missing key succeeded")
        self.passed(step, "absence checked by the next step")

        step = "concurrent-create"
        winners = self.race(k2)
        if len(winners) > 1:
            raise _Decided(StoreVerdict.LIES, step, f"{len(winners)} of {RACERS} creates won")

        wrong = "cas-wrong-version"
        if self.call(wrong, lambda: self.replace(k2, self.data("cas-wrong"), version), writes=True):
            raise _Decided(
                StoreVerdict.LIES, wrong, "a compare-and-swap with a wrong version succeeded"
            )
        stored = self.call(wrong, lambda: self.read(k2))
        content = None if stored is None else stored[0]
        if content == orphan:
            raise _Decided(
                StoreVerdict.LIES, "cas-missing", "a failed compare-and-swap created the key"
            )
        if not winners:
            raise _Decided(StoreVerdict.UNKNOWN, step, f"none of {RACERS} creates won")
        if content != self.data(f"racer-{winners[0]}"):
            raise _Decided(StoreVerdict.LIES, step, "the stored object is not the winner's")
        self.passed(step)
        self.passed(wrong)

    def streamed(self) -> Step | _Decided:
        """``stream-create-existing`` on a key of its own (run beside the other steps): its
        step, or the lie it found. Not finishing (the time bound, a failed request) decides
        nothing."""
        step = "stream-create-existing"
        if self.deadline - time.monotonic() < STREAM_MIN_S:
            return Step(step, None, "skipped: too little of the probe's time left")
        key, first = self.key(), self.data("stream-first")
        try:
            self.requests += 1
            if not self.create(key, first):
                return Step(step, None, "not decided: a create of a fresh key failed")
            self.requests += 2
            created = self.create_streamed(key)
            found = self.read(key)
        except Exception as exc:  # a store error, or anything else: no evidence of a lie
            return Step(step, None, f"not decided: {type(exc).__name__}: {exc}")
        if created:
            return _Decided(StoreVerdict.LIES, step, "a create of an existing key succeeded")
        if found is None or found[0] != first:
            return _Decided(StoreVerdict.LIES, step, "a failed create overwrote the object")
        return Step(step, True)

    def cleanup(self) -> Step:
        """Delete the probe keys, all at once (not where the store did not answer or denied
        writes)."""
        if self.unreachable or self.denied:
            why = "did not answer" if self.unreachable else "denies writes"
            return Step("cleanup", None, f"skipped: the store {why}")
        if time.monotonic() > self.deadline:
            return Step("cleanup", False, "not done before the deadline")
        self.requests += len(self.written)
        jobs = [
            background.start(functools.partial(self.store.delete_object, key), "plancache-probe")
            for key in list(self.written)
        ]
        for job in jobs:
            if not job.join(self.deadline - time.monotonic()):
                return Step("cleanup", False, "not done before the deadline")
            try:
                job.wait(0)
            except PlanStoreError as exc:
                return Step("cleanup", False, str(exc))
        return Step("cleanup", True)


def probe(store: ObjectLayer, *, timeout: float = PROBE_TIMEOUT_S) -> ProbeResult:
    """Run the probe on fresh random keys of ``store``; never raises a ``PlanStoreError``.
    Bounded: ``CHECK_REQUESTS`` primitive calls and three deletes, and ``timeout`` seconds
    (each call also bounded by the store's own call timeout)."""
    start = time.monotonic()
    run = _Run(store, start + timeout)
    verdict, step, detail = StoreVerdict.HONEST, None, "every precondition held"
    streaming = background.start(run.streamed, "plancache-probe")
    try:
        run.checks()
        streamed: Step | _Decided = Step(
            "stream-create-existing", None, "not decided: it did not finish in time"
        )
        if streaming.join(run.deadline - time.monotonic()):
            streamed = streaming.wait(0)
        if isinstance(streamed, _Decided):
            raise streamed
        run.steps.append(streamed)
    except _Decided as d:
        verdict, step, detail = d.verdict, d.step, d.detail
        run.steps.append(Step(d.step, False if verdict is StoreVerdict.LIES else None, detail))
    streaming.join(run.deadline - time.monotonic())  # its key, once written, is cleaned up
    run.steps.append(run.cleanup())
    seconds = time.monotonic() - start
    return ProbeResult(verdict, step, detail, tuple(run.steps), run.requests, seconds)
