"""The boot flow up to the save: the key, the crash-loop breaker's recovery and the store
fetch at ``load_model``, the decision (join, gate, crash mark, rank agreement, apply) at
``determine_available_memory``, the mark's removal after ``compile_or_warm_up_model``; the
boot state that ties them (the save, in ``save``, reads it too), and the process's cache
and breaker.

Its guarantees are the plugin's (``docs/vllm.md``, "Guarantees").
"""

from __future__ import annotations

import enum
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from plancache import _background as background
from plancache import _events as events
from plancache._background import Job
from plancache._cache import Decision, PendingLookup, PlanCache, Recorded
from plancache._defaults import EXPLAIN_DIR
from plancache._gate import Budget, implausible
from plancache._keys import Scalar
from plancache._observation import Observation
from plancache._reasons import Reason
from plancache._redaction import without_userinfo
from plancache._switches import enabled
from plancache._units import gib_text
from plancache.errors import ConfigError
from plancache.integrations.vllm.agreement import Tally, Vote, agree
from plancache.integrations.vllm.compiling import boot_compiles
from plancache.integrations.vllm.factors import (
    WorkerFactors,
    as_scalars,
    keep_for_explain,
    worker_factors,
    worker_labels,
)
from plancache.integrations.vllm.state import Plugin, current
from plancache.integrations.vllm.worker import WorkerLike, memory_figures

if TYPE_CHECKING:  # imported on first use: registering the plugin stays cheap
    from plancache._breaker import Breaker, Mark
    from plancache._config import Settings

log = logging.getLogger("plancache.vllm")

STATE_ATTR = "_plancache_boot"
"""The worker attribute that holds its ``Boot``."""

P = ParamSpec("P")
T = TypeVar("T")
"""Why this process's settings cannot be used (then the plugin is off), once known."""
builtins: dict[str, Callable[..., object]] = {}
"""vLLM's own startup-plan functions by name, kept by the patch: they run for a worker whose
key plancache could not compute."""


class BootMode(enum.StrEnum):
    """How this worker sizes its KV cache."""

    EXPLICIT = "explicit"
    """``kv_cache_memory_bytes`` was set (by the user, or by vLLM's built-in plan where
    plancache could not compute the key): no lookup, no save."""
    APPLIED = "applied"
    """A plan was applied: memory profiling skipped, nothing saved."""
    PROFILING = "profiling"
    """vLLM profiles; the result is saved after warm-up."""


@dataclass
class Boot:
    """This worker's boot, from ``load_model`` on; the decision and the save reuse its key."""

    factors: WorkerFactors | None = None
    free_memory: int | None = None
    labels: dict[str, Scalar] = field(default_factory=dict)
    pending: PendingLookup | None = None
    avoid: frozenset[str] = frozenset()
    """Digests of observations a boot on this node died with (``Breaker.recover``, run in the
    lookup's thread before its fetch)."""
    retractions: list[Job[bool]] = field(default_factory=list)
    """Background retractions of those observations, started by that recovery."""
    mark: Mark | None = None
    """The crash mark of the observation this boot applies, until the warm-up returned."""
    builtin: bool = False
    """True if plancache could not compute the key: vLLM's built-in functions act instead."""
    mode: BootMode | None = None
    compiles: bool | None = None
    """Whether the profiling run was expected to compile, at the decision (``boot_compiles``:
    None if not known); only then are provisional observations candidates."""
    compiled: bool | None = None
    """Whether vLLM's counters saw a compile during ``determine_available_memory`` (None if
    not read): a profile that did records a provisional observation."""
    decision: Decision | None = None
    tally: Tally | None = None
    spent: float = 0.0
    """Seconds of the lookup's time budget that ``begin`` spent before the lookup started
    (the key). The budget runs from ``begin``: the decision waits for the lookup (recovery
    and fetch) at most what is left of it when the weights are loaded, so a store slower
    than the weights' loading costs no wait after them."""
    saved: bool = False
    """True once this boot's save was taken (run, or started in the background): never again."""
    saving: Job[Recorded | None] | None = None
    """The save started in the background, if any."""
    recorded: Recorded | None = None
    costs: dict[str, float] = field(default_factory=dict)
    """Seconds the plugin added to each wrapped method (its own work, peers' waits included),
    and, within them, to the breaker's ``breaker.arm`` and ``breaker.disarm``; and the
    seconds of ``breaker.recover`` in the lookup's thread. Timing only: nothing reads it to
    decide."""


def safely(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | None:
    """``fn(*args, **kwargs)``, or None with a warning if it raises: the boot goes on."""
    try:
        return fn(*args, **kwargs)
    except Exception:
        log.warning("plancache: %s failed; booting as usual", fn.__name__, exc_info=True)
        return None


def _settings(plugin: Plugin) -> Settings:
    """This process's settings, read from the environment once (call under
    ``plugin.plans_lock``). If they cannot be used, logs one ERROR and raises ``ConfigError``
    at this and every later call: the plugin is off for the process."""
    if plugin.config_error is not None:
        raise ConfigError(plugin.config_error)
    if plugin.settings is None:
        from plancache._config import Settings

        try:
            plugin.settings = Settings.from_env()
        except ConfigError as exc:
            plugin.config_error = str(exc)
            log.error(
                "plancache: %s; plancache is off in this process: no plan is applied or "
                "recorded, every boot profiles",
                exc,
            )
            raise
    return plugin.settings


def get_cache() -> PlanCache:
    """This process's cache (``state.current()``), made from the environment on first use."""
    plugin = current()
    with plugin.plans_lock:
        if plugin.cache is None:
            plugin.cache = PlanCache.from_settings(_settings(plugin))
        return plugin.cache


def get_breaker() -> Breaker:
    """This process's crash-loop breaker, made from the environment on first use: its marks
    live in the local tier, else in the local store, else in the default directory."""
    plugin = current()
    with plugin.plans_lock:
        if plugin.breaker is None:
            from plancache._breaker import Breaker

            plugin.breaker = Breaker.from_settings(_settings(plugin))
        return plugin.breaker


class _BackgroundRetract:
    """What ``Breaker.recover`` retracts through: each retraction (``PlanCache.retract``:
    bounded, never raises) runs on a daemon thread of its own (``background.start``), so its
    store I/O never holds up the lookup; the jobs are appended to ``jobs``."""

    def __init__(self, cache: PlanCache, jobs: list[Job[bool]]) -> None:
        self.cache = cache
        self.jobs = jobs

    def retract(self, fingerprint: str, observation: Observation) -> Job[bool]:
        job = background.start(
            lambda: self.cache.retract(fingerprint, observation), "plancache-retract"
        )
        self.jobs.append(job)
        return job


def warm() -> None:
    """Open the store in the background while the worker loads its model, so that the
    lookup's time budget is spent on the request, not on importing a client library; make
    the breaker now, not on ``load_model``'s entry. Settings that cannot be used: nothing
    (``_settings`` logged why)."""
    try:
        cache = get_cache()
    except ConfigError:
        return
    cache.warm()
    get_breaker()


def boot_of(worker: object) -> Boot | None:
    """``worker``'s boot state, if the plugin began one."""
    boot = getattr(worker, STATE_ATTR, None)
    return boot if isinstance(boot, Boot) else None


def maybe_apply_startup_plan(worker: WorkerLike) -> Decision | None:
    """vLLM's ``maybe_apply_startup_plan`` on the configured store: if enabled and no
    explicit ``kv_cache_memory_bytes`` is set, set it from a plan that this worker's gate and
    every rank's accept. A plan applied leaves a crash mark: call ``warmed_up(worker)`` once
    the warm-up returned. The decision, or None when nothing was looked up. Raises only
    ``RankAgreementError`` (the ranks could not vote: the boot must stop)."""
    if not enabled():
        return None
    safely(begin, worker)
    return decide(worker)


def warmed_up(worker: WorkerLike) -> None:
    """Call once ``worker``'s ``compile_or_warm_up_model`` returned: the KV cache is allocated
    and the warm-up ran, so a plan it applied fitted; removes that plan's crash mark. A worker
    that applied a plan and never calls it leaves a mark that the next boot on this node reads
    as a crash with that plan (the patch calls it). Never raises."""
    boot = boot_of(worker)
    if boot is not None:
        _disarm(boot)


def begin(worker: WorkerLike) -> Boot:
    """Start this worker's boot once: compute the key (now: ``compute_hash()`` changes later
    in startup) and start the lookup in a daemon thread, which first recovers the crash marks
    of this key that dead processes left on this node (their observations are avoided; their
    retraction runs in the background), then fetches the record. Never raises for a bad
    worker, config or store: that worker is left to vLLM's built-in functions, except where
    the settings cannot be used (then it profiles and nothing records a plan)."""
    boot = boot_of(worker)
    if boot is not None:
        return boot
    start = time.perf_counter()
    boot = Boot()
    setattr(worker, STATE_ATTR, boot)
    if worker.cache_config.kv_cache_memory_bytes is not None:
        return boot  # explicit: no lookup
    try:
        factors = worker_factors(worker)
        free = worker.init_snapshot.free_memory
        cache = get_cache()
    except ConfigError:
        return boot  # plancache is off (``_settings`` logged why): profile, record nothing
    except Exception as exc:
        boot.builtin = True
        log.warning(
            "plancache: rank %s: no lookup: %s: %s; vLLM's built-in startup plan stays in place",
            getattr(worker, "rank", "?"),
            type(exc).__name__,
            exc,
        )
        return boot
    boot.factors, boot.free_memory = factors, free
    boot.labels = worker_labels(worker)
    avoid = functools.partial(_avoid, boot, cache)  # called with the key in the lookup's thread
    boot.pending = cache.start_lookup(as_scalars(factors), free, avoid=avoid)
    boot.spent = time.perf_counter() - start
    return boot


def _avoid(boot: Boot, cache: PlanCache, key: str) -> frozenset[str]:
    """What the lookup of ``key`` avoids, in its thread: the digests ``Breaker.recover``
    returns (local reads; retractions in the background again), none where it failed."""
    boot.avoid = safely(_recover, boot, cache, key) or frozenset()
    return boot.avoid


def _recover(boot: Boot, cache: PlanCache, key: str) -> frozenset[str]:
    """``Breaker.recover`` for ``key``, timed into ``boot.costs``."""
    start = time.perf_counter()
    avoid = get_breaker().recover(_BackgroundRetract(cache, boot.retractions), key)
    boot.costs["breaker.recover"] = time.perf_counter() - start
    return avoid


def _disarm(boot: Boot) -> None:
    """Remove this boot's crash mark, if it holds one (a local unlink). Never raises."""
    mark, boot.mark = boot.mark, None
    if mark is None:
        return
    start = time.perf_counter()
    safely(get_breaker().disarm, mark)
    boot.costs["breaker.disarm"] = time.perf_counter() - start


def decide(worker: WorkerLike) -> Decision | None:
    """Join the fetch (waiting at most what is left of the budget that started at
    ``begin``), vote with every rank,
    then apply or profile; once per worker. The decision, or None when nothing was looked up.
    Raises only ``RankAgreementError``."""
    boot = boot_of(worker) or safely(begin, worker)
    if boot is None:
        boot = Boot(builtin=True)  # a worker that holds no state: it still votes
    elif boot.mode is not None:
        return None  # decided once per worker
    vote = safely(_vote, worker, boot)
    if vote is None:  # a worker that cannot be read: profile, as vLLM would
        vote = Vote.PROFILE
    try:
        boot.tally = agree(vote)
    except BaseException:
        _disarm(boot)  # nothing applied: a mark left now would read as a crash with the plan
        raise
    safely(_conclude, worker, boot, vote, boot.tally)
    if boot.mode is None:
        boot.mode = BootMode.PROFILING
    if boot.mode is not BootMode.APPLIED:
        _disarm(boot)
    return boot.decision


def _vote(worker: WorkerLike, boot: Boot) -> Vote:
    if worker.cache_config.kv_cache_memory_bytes is not None:
        return Vote.EXPLICIT
    if boot.pending is None:
        if boot.builtin and "maybe_apply_startup_plan" in builtins:
            builtins["maybe_apply_startup_plan"](worker)
        explicit = worker.cache_config.kv_cache_memory_bytes is not None
        return Vote.EXPLICIT if explicit else Vote.PROFILE
    boot.compiles = safely(boot_compiles, worker)
    wait = get_cache().timeout - boot.spent - (time.perf_counter() - boot.pending.started)
    figures = memory_figures(worker)
    budget = Budget(figures.requested_memory, figures.weights_memory)
    boot.decision = decision = boot.pending.result(wait, budget=budget, compiles=boot.compiles)
    safely(_retract_implausible, boot, decision, budget)
    if not decision.hit or decision.observation is None or decision.fingerprint is None:
        return Vote.PROFILE
    start = time.perf_counter()
    boot.mark = get_breaker().arm(decision.fingerprint, decision.observation)
    boot.costs["breaker.arm"] = time.perf_counter() - start
    if boot.mark is None:  # a crash with the plan could repeat on every boot: profile
        return Vote.PROFILE
    return Vote.APPLY


def _retract_implausible(boot: Boot, decision: Decision, budget: Budget) -> None:
    """Retract, in the background, the observations of the record found that no profiled
    boot of this key could have allocated (over requested memory minus the weights): never
    applied, they would otherwise stay, and dominate and so drop honest observations at
    every merge. A read-only store retracts in its local tier only."""
    if decision.plan is None or decision.fingerprint is None:
        return
    retract = _BackgroundRetract(get_cache(), boot.retractions)
    for observation in implausible(decision.plan, budget):
        log.warning(
            "plancache: retracting observation kv=%s baseline=%s of fp=%s: over requested "
            "memory %s - weights %s",
            observation.kv_cache_memory_bytes,
            observation.free_memory_baseline,
            decision.fingerprint[:12],
            budget.requested_memory,
            budget.weights_memory,
        )
        retract.retract(decision.fingerprint, observation)


def _explain(boot: Boot) -> str:
    """On a miss, where its factors are kept (written on a daemon thread: ``keep_for_explain``)
    and the command that names what differs from the stored plans; else ""."""
    decision, factors = boot.decision, boot.factors
    if decision is None or decision.reason is not Reason.MISS or not decision.fingerprint:
        return ""
    settings = current().settings
    if factors is None or settings is None:
        return ""
    path = Path(settings.local_dir) / EXPLAIN_DIR / f"{decision.fingerprint}.json"
    keep = functools.partial(
        keep_for_explain, settings.local_dir, decision.fingerprint, factors, boot.labels
    )
    background.start(functools.partial(safely, keep), "plancache-explain")
    store = without_userinfo(settings.url)
    return f"; `plancache explain {store} --factors {path}` names what differs"


def _conclude(worker: WorkerLike, boot: Boot, vote: Vote, tally: Tally) -> None:
    rank = getattr(worker, "rank", "?")
    agreement = f"; {tally.describe()}" if tally.size > 1 else ""
    if tally.inconsistent:
        log.error(
            "plancache: rank %s: kv_cache_memory_bytes is explicit on %s of %s ranks while "
            "%s must profile (no applicable plan): the ranks cannot all take the same path "
            "and may hang in collectives; set kv_cache_memory_bytes on every rank and DP "
            "engine or on none",
            rank,
            tally.explicit,
            tally.size,
            tally.profile,
        )
    fp = "-"
    if boot.decision is not None and boot.decision.fingerprint:
        fp = boot.decision.fingerprint[:12]
    if vote is Vote.EXPLICIT:
        boot.mode = BootMode.EXPLICIT
        log.info(
            "plancache: rank %s: kv_cache_memory_bytes=%s set explicitly; no lookup, no save%s",
            rank,
            worker.cache_config.kv_cache_memory_bytes,
            agreement,
        )
    elif vote is Vote.APPLY and tally.all_skip and boot.decision is not None:
        kv = boot.decision.kv_cache_memory_bytes
        worker.cache_config.kv_cache_memory_bytes = kv
        boot.mode = BootMode.APPLIED
        plan, chosen = boot.decision.plan, boot.decision.observation
        provisional = plan is not None and chosen in plan.provisional
        log.info(
            "plancache: rank %s applies %splan fp=%s: kv_cache_memory_bytes=%s (%s), "
            "memory profiling skipped%s",
            rank,
            "provisional " if provisional else "",
            fp,
            kv,
            gib_text(kv),
            agreement,
        )
    else:
        boot.mode = BootMode.PROFILING
        why = "another rank must profile" if vote is Vote.APPLY else "no applicable plan"
        if boot.decision is not None and boot.decision.reason is Reason.PROVISIONAL:
            why = (
                f"{Reason.PROVISIONAL}: only boots that compiled during profiling measured "
                "this key, and this one is not known to compile; its profile serves the "
                "boots that load compiled code"
            )
        elif boot.decision is not None and not boot.decision.hit:
            why = boot.decision.reason
        elif boot.decision is not None and vote is Vote.PROFILE:
            why = "no crash mark could be written, so the plan is not applied"
        elif current().config_error is not None:
            why = "plancache is off: configuration error"
        log.info(
            "plancache: rank %s profiles (%s) fp=%s%s%s", rank, why, fp, agreement, _explain(boot)
        )
    _boot_event(rank, boot, vote)


def _boot_event(rank: object, boot: Boot, vote: Vote) -> None:
    """The ``boot`` event of this rank (``plancache._events``): whether the plan was applied,
    whether it was provisional, and the reason, as the log line above tells it."""
    decision = boot.decision
    plan = None if decision is None else decision.plan
    provisional = (
        plan is not None and decision is not None and decision.observation in plan.provisional
    )
    applied = boot.mode is BootMode.APPLIED
    if vote is Vote.EXPLICIT:
        reason = Reason.EXPLICIT
    elif applied:
        reason = Reason.HIT
    elif decision is not None and not decision.hit:
        reason = decision.reason
    elif decision is not None and vote is Vote.PROFILE:
        reason = Reason.NO_CRASH_MARK
    elif vote is Vote.APPLY:
        reason = Reason.OTHER_RANK
    elif current().config_error is not None:
        reason = Reason.CONFIG_ERROR
    else:
        reason = Reason.MISS
    fingerprint = None if decision is None else decision.fingerprint
    events.emit(
        "boot",
        "plans",
        reason,
        rank=rank,
        applied=applied,
        provisional=applied and provisional,
        fingerprint=fingerprint,
    )
