"""``PlanCache``: bounded, fail-open lookup and record of plans on a boot path.

Neither ``lookup`` nor ``record`` ever raises, and neither takes longer than the time budget
(default 2 s) plus, where no idle thread is at hand, a thread's start-up: store I/O runs on a
daemon thread (``plancache._background``) that the caller stops waiting for at the deadline.
Past it, or on any doubt, the answer is a miss and the boot profiles as usual. A record that
outlives its budget goes on in the background, and the process's exit waits for such records
at most ``RECORD_EXIT_WAIT_S`` in all: a store slower than the budget loses no observation
unless it is slower than that too (then a WARNING says the record was lost). Every decision
is logged on ``logging.getLogger("plancache")``. Signatures are the store's
(``PlanStore.keyring``): where it holds keys, a record without a valid signature is never
applied (``invalid:signature``), and ``record`` signs what it writes.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from plancache import _background as background
from plancache import _events as events
from plancache import _metrics as metrics
from plancache._backends.lazy import Opening
from plancache._background import Job, JobTimeout
from plancache._defaults import DEFAULT_BUDGET_S, RECORD_EXIT_WAIT_S
from plancache._gate import Budget, gate
from plancache._keys import Scalar, fingerprint
from plancache._objects import ObjectLayer
from plancache._observation import Observation
from plancache._plan import Plan
from plancache._reasons import RECORD_FAILURES, PutOutcome, Reason
from plancache._redaction import scrub
from plancache._store import PlanStore, describe_failure, plans_of
from plancache._units import gib_text as _gib
from plancache._version import __version__
from plancache.errors import (
    ConfigError,
    InvalidArgumentError,
    PlanStoreReadOnlyError,
)

if TYPE_CHECKING:
    from plancache._config import Settings

log = logging.getLogger("plancache")
T = TypeVar("T")


@dataclass(frozen=True)
class Decision:
    """The answer of a lookup. ``kv_cache_memory_bytes`` is None unless ``reason == "hit"``
    (see ``Reason`` for every reason)."""

    kv_cache_memory_bytes: int | None
    reason: Reason
    fingerprint: str | None
    seconds: float
    plan: Plan | None = None
    """The record found, if any."""
    detail: str = ""
    observation: Observation | None = None
    """The observation applied (on a hit): the largest KV whose baseline the gate accepts."""

    @property
    def hit(self) -> bool:
        return self.kv_cache_memory_bytes is not None


@dataclass(frozen=True)
class Recorded:
    """The result of a record: ``reason`` is the put's ``outcome`` when it stored (created,
    replaced or kept), else why nothing was stored (a ``Reason`` of ``RECORD_FAILURES``:
    ``invalid-input``, ``store-error``, ``timeout``, ``error``) and ``outcome`` is None."""

    outcome: PutOutcome | None
    reason: PutOutcome | Reason
    fingerprint: str | None
    seconds: float
    detail: str = ""


_late: list[tuple[Job[PutOutcome], str]] = []
_late_lock = threading.Lock()
_waiting = False


def _finish_at_exit(job: Job[PutOutcome], fp: str) -> None:
    """Let ``job`` (a record past its budget) finish before the process exits, bounded."""
    global _waiting
    with _late_lock:
        if not _waiting:
            atexit.register(_wait_for_late, RECORD_EXIT_WAIT_S)
            _waiting = True
        _late[:] = [(j, f) for j, f in _late if not j.done()]  # a long process keeps few
        _late.append((job, fp))


def _wait_for_late(bound: float) -> None:
    """Join the records still running, ``bound`` seconds in all; log each one's end."""
    deadline = time.monotonic() + bound
    with _late_lock:
        late = list(_late)
    for job, fp in late:
        if job.join(max(0.0, deadline - time.monotonic())):
            try:
                log.info(
                    "plancache: record %s fp=%s (after its budget)", job.wait(0).value, _short(fp)
                )
            except Exception as exc:
                log.warning("plancache: record fp=%s failed after its budget: %s", _short(fp), exc)
        else:
            log.warning(
                "plancache: record fp=%s still running at exit after %.0f s: lost",
                _short(fp),
                bound,
            )


class PlanCache:
    """Lookup and record of plans with a time budget; never raises, never stalls a boot.
    Closes the store it opened (``close``, or the end of a ``with`` block)."""

    def __init__(
        self,
        store: PlanStore | ObjectLayer | Callable[[], PlanStore | ObjectLayer],
        timeout: float = DEFAULT_BUDGET_S,
    ) -> None:
        """``timeout`` is the budget of each lookup and record, I/O and decoding included.
        ``store``: the plans kind (``PlanStore``, ``open_store(url)``), or an object layer,
        on which the plans kind is built (``PlanStore(layer)``: plancache 0.3.0's
        ``PlanCache(LocalStore(path))`` keeps working), or a factory of either, called
        through an ``Opening`` on first use (again on the next use while it raises), so that
        opening a remote client is bounded like any other I/O. Anything else raises
        ``ConfigError`` here, naming what to give instead."""
        if not timeout > 0:
            raise InvalidArgumentError(f"timeout must be positive, got {timeout!r}")
        self.timeout = float(timeout)
        self._opening: Opening[PlanStore] | None = None
        self._store: PlanStore | None = None
        self._closed = False
        if isinstance(store, PlanStore | ObjectLayer):
            self._store = plans_of(store, "store")
        elif callable(store):
            name = getattr(store, "__qualname__", type(store).__name__)
            self._opening = Opening(f"{name}()", lambda: plans_of(store(), f"{name}()"))
        else:
            raise ConfigError(
                f"PlanCache takes a store, got {type(store).__qualname__} {store!r:.80}: write "
                "PlanCache(open_store(url)), PlanCache(PlanStore(layer)) or "
                "PlanCache.from_env()"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PlanCache:
        """A cache on the store the ``PLANCACHE_*`` variables describe (opened lazily).
        Raises ``ConfigError`` for a malformed variable."""
        from plancache._config import Settings

        return cls.from_settings(Settings.from_env(environ))

    @classmethod
    def from_settings(cls, settings: Settings) -> PlanCache:
        """A cache on ``settings``' store (opened lazily) with its time budget."""
        return cls(settings.open_store, timeout=settings.timeout)

    @property
    def store(self) -> PlanStore:
        """The store; where a factory was given, the store it returned, opened on first use
        (``Opening.opened``: raises what opening raised, or past its ``open_timeout``)."""
        if self._store is not None:
            return self._store
        assert self._opening is not None
        return self._opening.opened

    def close(self) -> None:
        """Close the store this cache opened (where a factory was given and has returned);
        a store given is the caller's, left open. Idempotent; never raises: a failure to
        close is logged. A lookup or record after it fails open (its reason says why)."""
        opened = None if self._opening is None else self._opening.value
        if opened is None or self._closed:
            return
        self._closed = True
        try:
            opened.close()
        except Exception as exc:  # never raises: the caller is done with the store
            log.warning("plancache: close: %s: %s", type(exc).__name__, scrub(str(exc)))

    def __enter__(self) -> PlanCache:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def warm(self) -> None:
        """Start opening the store (calling the factory, if one was given) and the stores
        beneath it that open on first use (a tier's remote store: its client library, its
        credentials) on daemon threads, and return at once, so that a later lookup's budget
        goes to the request alone. Never raises; a failure to open shows up in the next
        lookup's reason."""
        try:
            if self._store is not None:
                self._store.warm()
            elif self._opening is not None:
                self._opening.warm()
        except Exception as exc:  # never raises: a later lookup names it
            log.debug("plancache: warm: %s: %s", type(exc).__name__, scrub(str(exc)))

    def lookup(
        self,
        factors: Mapping[str, Scalar],
        current_free_memory: int,
        *,
        budget: Budget | None = None,
        avoid: Collection[str] = (),
        compiles: bool | None = None,
    ) -> Decision:
        """The KV-cache size to apply for ``factors`` now, or a miss with its reason.

        ``budget``: what this boot may use (``plancache._gate.Budget``); an observation whose
        KV cache exceeds requested memory minus the weights is never applied, and a smaller
        plausible one of the same record is applied instead. ``avoid``: digests of
        observations not to apply (``Breaker.avoided``). ``compiles``: True if this boot
        compiles during profiling (then provisional observations apply too), None if not
        known (``plancache._gate``). A tiered store keeps looking in the remote while the
        local tier's record has nothing the gate accepts."""
        pending = self.start_lookup(factors, current_free_memory, avoid=avoid, budget=budget)
        return pending.result(self.timeout, budget=budget, compiles=compiles)

    def start_lookup(
        self,
        factors: Mapping[str, Scalar],
        current_free_memory: int,
        *,
        avoid: Collection[str] | Callable[[str], Collection[str]] = (),
        budget: Budget | None = None,
    ) -> PendingLookup:
        """Start the lookup of ``factors`` in a daemon thread and return at once; join it
        with ``PendingLookup.result(wait, budget=...)`` (a boot knows its budget only once
        the weights are loaded; a ``budget`` known now also steers a tiered store's search).
        The fetch itself is not bounded: only the join is, so a fetch may overlap other work
        (loading weights) for free. ``avoid``: as for ``lookup``, or a function of the key
        that returns it, called first in that thread (``Breaker.recover``: its reads of the
        marks then overlap that work too, within the join's bound; what it raises fails the
        lookup). Never raises."""
        return PendingLookup(self, factors, current_free_memory, avoid, budget)

    def retract(self, fingerprint: str, observation: Observation) -> bool:
        """Remove ``observation`` from the record under ``fingerprint`` and tombstone it
        (``PlanStore.retract``; a read-only tiered store only touches its local tier). True
        if it was removed; False if the retraction changed nothing (no record, none holding
        it, or a read-only store without a local tier) or the store failed, each logged as
        such. Bounded by the time budget; never raises."""
        start = time.perf_counter()
        refused: PlanStoreReadOnlyError | None = None
        try:
            done = background.start(lambda: self.store.retract(fingerprint, observation)).wait(
                self.timeout
            )
        except PlanStoreReadOnlyError as exc:  # read-only, no local tier: nothing to change
            refused = exc
        except Exception as exc:
            reason, detail = describe_failure(exc)
            log.warning(
                "plancache: retract %s fp=%s failed in %.1f ms: %s",
                reason.value,
                _short(fingerprint),
                (time.perf_counter() - start) * 1e3,
                detail,
            )
            return False
        store = self.store  # open: the retraction went through it
        what, where = "retracted", f"from {store.url}"
        if refused is not None:
            what, where = "not retracted", f"({refused}, with no local tier)"
        elif not done.removed:
            held = "no record of that key" if done.record is None else "no such observation"
            what, where = "retract changed nothing", f"({store.url} holds {held})"
        log.warning(
            "plancache: %s fp=%s kv=%s baseline=%s %s in %.1f ms",
            what,
            _short(fingerprint),
            _gib(observation.kv_cache_memory_bytes),
            _gib(observation.free_memory_baseline),
            where,
            (time.perf_counter() - start) * 1e3,
        )
        return refused is None and done.removed

    def record(
        self,
        factors: Mapping[str, Scalar],
        *,
        kv_cache_memory_bytes: int,
        free_memory_baseline: int,
        labels: Mapping[str, Scalar] | None = None,
        provisional: bool = False,
    ) -> Recorded:
        """Store the outcome of a profiled boot under ``fingerprint(factors)`` as one
        observation, merged into the record's frontier (``labels``: descriptive, never part
        of the key; ``provisional``: the boot compiled during profiling, so only boots that
        compile apply it). Bounded by the time budget; never raises."""
        start = time.perf_counter()
        fp: str | None = None
        outcome: PutOutcome | None = None
        reason: PutOutcome | Reason
        detail = ""
        try:
            plan = Plan.new(
                factors,
                kv_cache_memory_bytes=kv_cache_memory_bytes,
                free_memory_baseline=free_memory_baseline,
                producer={"host": os.uname().nodename, "plancache": __version__},
                labels=labels,
                provisional=provisional,
            )
            plan.encode()
        except Exception as exc:  # whatever the caller's values raise
            reason, detail = Reason.INVALID_INPUT, f"{type(exc).__name__}: {exc}"
        else:
            fp = plan.fingerprint
            job = background.start(lambda: self.store.put(plan), "plancache-record")
            try:
                reason = outcome = job.wait(self.timeout)
            except JobTimeout as exc:
                _finish_at_exit(job, fp)
                reason, detail = describe_failure(exc)
                detail += " (it goes on; the exit waits for it)"
            except Exception as exc:
                failure, detail = describe_failure(exc)
                reason = failure if failure in RECORD_FAILURES else Reason.ERROR
        result = Recorded(outcome, reason, fp, time.perf_counter() - start, detail)
        metrics.write("plans", reason.value)
        level = logging.INFO if outcome is not None else logging.WARNING
        log.log(
            level,
            "plancache: record %s fp=%s kv=%s baseline=%s%s in %.1f ms%s",
            reason.value,
            _short(fp),
            _gib(kv_cache_memory_bytes),
            _gib(free_memory_baseline),
            " provisional (compiled during profiling)" if provisional else "",
            result.seconds * 1e3,
            f": {detail}" if detail else "",
        )
        return result


class PendingLookup:
    """A lookup running in a daemon thread (``PlanCache.start_lookup``). ``result`` gates the
    fetched record on the caller's thread and logs the decision, once."""

    def __init__(
        self,
        cache: PlanCache,
        factors: Mapping[str, Scalar],
        current_free_memory: int,
        avoid: Collection[str] | Callable[[str], Collection[str]] = (),
        budget: Budget | None = None,
    ) -> None:
        self.started = time.perf_counter()
        self.current_free_memory = current_free_memory
        self.avoid: frozenset[str] = frozenset() if callable(avoid) else frozenset(avoid)
        """Digests not to apply; where ``avoid`` is a function, what it returned (set in the
        fetch's thread before the fetch)."""
        self._decision: Decision | None = None
        self._fetch: Job[Plan | None] | None = None
        self._invalid = ""
        self.fingerprint: str | None = None
        self.model: object = ""
        try:
            self.model = factors.get("model", "")
            self.fingerprint = fingerprint(factors)
        except Exception as exc:  # whatever the caller's mapping raises
            self._invalid = f"{type(exc).__name__}: {exc}"
            return
        key = self.fingerprint

        def usable(p: Plan) -> bool:
            return gate(p, current_free_memory, budget, self.avoid)[0] is not None

        def fetch() -> Plan | None:
            if callable(avoid):
                self.avoid = frozenset(avoid(key))
            return cache.store.find(key, usable)

        self._fetch = background.start(fetch, "plancache-lookup")

    def done(self) -> bool:
        """True once the fetch has finished (found, missed or failed)."""
        return self._fetch is None or self._fetch.done()

    def result(
        self, wait: float, *, budget: Budget | None = None, compiles: bool | None = None
    ) -> Decision:
        """The decision, waiting at most ``wait`` seconds for the fetch (a ``timeout`` miss
        past it), gated by free memory, ``budget``, ``compiles`` (see ``PlanCache.lookup``)
        and the observations to avoid. The first call decides; later calls return the same
        one."""
        if self._decision is not None:
            return self._decision
        plan: Plan | None = None
        chosen: Observation | None = None
        detail = ""
        if self._fetch is None:
            reason, detail = Reason.INVALID_FACTORS, self._invalid
        else:
            try:
                plan = self._fetch.wait(wait)
            except Exception as exc:
                reason, detail = describe_failure(exc)
            else:
                if plan is None:
                    reason = Reason.MISS
                else:
                    chosen, reason = gate(
                        plan, self.current_free_memory, budget, self.avoid, compiles
                    )
                    if reason in (Reason.EXCEEDS_BUDGET, Reason.BUDGET_UNKNOWN):
                        detail = _budget_detail(plan, self.current_free_memory, budget)
        kv = None if chosen is None else chosen.kv_cache_memory_bytes
        seconds = time.perf_counter() - self.started
        self._decision = Decision(kv, reason, self.fingerprint, seconds, plan, detail, chosen)
        _log_lookup(self._decision, self.current_free_memory)
        events.decision("plans", reason, seconds, self.model)
        return self._decision


def _short(fp: str | None) -> str:
    return fp[:12] if fp else "-"


def _budget_detail(plan: Plan, current_free_memory: object, budget: Budget | None) -> str:
    """The numbers behind a plausibility rejection."""
    assert budget is not None
    requested, weights = budget.requested_memory, budget.weights_memory
    if type(requested) is not int or type(weights) is not int:
        return f"budget figures are not usable: requested={requested!r:.40} weights={weights!r:.40}"
    fits = [
        o.kv_cache_memory_bytes
        for o in plan.observations
        if type(current_free_memory) is int and o.free_memory_baseline <= current_free_memory
    ]
    return (
        f"smallest applicable kv={_gib(min(fits, default=0))} ({min(fits, default=0)} B) exceeds "
        f"requested={_gib(requested)} ({requested} B) - weights={_gib(weights)} ({weights} B)"
        f" = {requested - weights} B"
    )


def _log_lookup(d: Decision, current_free_memory: object) -> None:
    extra = ""
    if d.observation is not None:
        extra = (
            f" kv={_gib(d.observation.kv_cache_memory_bytes)}"
            f" baseline={_gib(d.observation.free_memory_baseline)}"
        )
    if d.plan is not None:
        extra += (
            f" free={_gib(current_free_memory)} observations={len(d.plan.observations)}"
            f" lowest-baseline={_gib(d.plan.min_free_memory_baseline)}"
        )
        if d.plan.provisional:
            extra += f" provisional={len(d.plan.provisional)}"
    suspicious = d.reason in (Reason.EXCEEDS_BUDGET, Reason.BUDGET_UNKNOWN, Reason.CRASHED_BEFORE)
    quiet = d.reason in (Reason.HIT, Reason.MISS) or (
        d.reason.startswith("gate") and not suspicious
    )
    level = logging.INFO if quiet else logging.WARNING
    log.log(
        level,
        "plancache: lookup %s fp=%s%s in %.1f ms%s",
        d.reason.value,
        _short(d.fingerprint),
        extra,
        d.seconds * 1e3,
        f": {d.detail}" if d.detail else "",
    )
