"""The apply-time gates: which observation of a plan, if any, may be applied on this device
now (pure).

Two rules, both required of the observation applied:

- free memory: the device has at least as much free memory now as when the observation was
  recorded (``free_memory_baseline <= current_free_memory``);
- plausibility (with a ``Budget``): its KV cache fits in what this boot may use after its
  weights, ``kv_cache_memory_bytes <= requested_memory - weights_memory``. A larger KV size
  cannot be what a profiled boot of this model allocated, whatever the record claims.

Provisional observations (``Plan.provisional``: measured by a boot that compiled during
profiling, whose temporaries shrank its KV cache) are candidates only for a boot that
compiles too (``compiles=True``); a boot that loads compiled code, or does not know yet
(``None``), profiles instead where only a provisional one would pass
(``gate:provisional``), and its profile is the warm observation that every later node
applies.

Of the observations that pass both, the largest KV cache is applied. A frontier's KV sizes
grow with its baselines, so when the best point by free memory is implausible the gate falls
back to a smaller plausible point of the same record. Doubt always means "profile": a
malformed figure rejects every observation.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from plancache._observation import Observation
from plancache._plan import Plan
from plancache._reasons import Reason
from plancache.errors import InvalidArgumentError


@dataclass(frozen=True)
class Budget:
    """What this boot may use, for the plausibility rule: ``requested_memory`` (total device
    memory x ``gpu_memory_utilization``) and ``weights_memory`` (what the loaded weights take).

    A figure that is None means "not known": no plausibility check (the free-memory gate still
    applies). A figure that is not an int (bool is not), a ``requested_memory`` <= 0 or a
    ``weights_memory`` < 0 is doubt: nothing is applied (``gate:budget-unknown``)."""

    requested_memory: int | None = None
    weights_memory: int | None = None

    def limit(self) -> int | None:
        """The largest plausible KV size (may be <= 0: nothing fits); None when unchecked.
        Raises ``InvalidArgumentError`` (a ``ValueError``) for malformed figures."""
        requested, weights = self.requested_memory, self.weights_memory
        if requested is None or weights is None:
            return None
        if type(requested) is not int or type(weights) is not int:
            raise InvalidArgumentError("budget figures must be ints")
        if requested <= 0 or weights < 0:
            raise InvalidArgumentError("requested memory must be > 0 and weights memory >= 0")
        return requested - weights


def gate(
    plan: Plan,
    current_free_memory: int,
    budget: Budget | None = None,
    avoid: Collection[str] = (),
    compiles: bool | None = None,
) -> tuple[Observation | None, Reason]:
    """(observation to apply or None, reason): the largest KV cache among the observations
    (provisional ones too where ``compiles`` is True) whose baseline the free memory covers,
    whose digest is not in ``avoid`` (observations a crashed boot applied) and that fit the
    ``budget``. The reason names the first rule that left nothing:
    ``gate:free-memory-unknown``/``-below-baseline``, ``gate:crashed-before``,
    ``gate:budget-unknown``/``exceeds-budget``; ``gate:provisional`` where only a
    provisional observation would have passed."""
    if compiles is True:
        return _gate(plan.observations + plan.provisional, current_free_memory, budget, avoid)
    found = _gate(plan.observations, current_free_memory, budget, avoid)
    if found[0] is not None or not plan.provisional:
        return found
    other = _gate(plan.provisional, current_free_memory, budget, avoid)
    if other[0] is not None:
        return None, Reason.PROVISIONAL
    return found if plan.observations else other  # its reason names the rule


def _gate(
    points: tuple[Observation, ...],
    current_free_memory: int,
    budget: Budget | None,
    avoid: Collection[str],
) -> tuple[Observation | None, Reason]:
    if type(current_free_memory) is not int or current_free_memory <= 0:
        return None, Reason.FREE_MEMORY_UNKNOWN
    if not points:  # every observation was retracted
        return None, Reason.MISS
    fits = [o for o in points if o.free_memory_baseline <= current_free_memory]
    if not fits:
        return None, Reason.BELOW_BASELINE
    if avoid:
        fits = [o for o in fits if o.digest not in avoid]
        if not fits:
            return None, Reason.CRASHED_BEFORE
    try:
        limit = None if budget is None else budget.limit()
    except ValueError:
        return None, Reason.BUDGET_UNKNOWN
    if limit is not None:
        fits = [o for o in fits if o.kv_cache_memory_bytes <= limit]
        if not fits:
            return None, Reason.EXCEEDS_BUDGET
    return max(fits, key=lambda o: o.kv_cache_memory_bytes), Reason.HIT


def implausible(plan: Plan, budget: Budget | None) -> list[Observation]:
    """The observations of ``plan`` whose KV cache exceeds what ``budget`` allows: no
    profiled boot of this key could have allocated them (every factor that sizes the budget
    is part of the key). Empty when the budget is unknown or malformed."""
    try:
        limit = None if budget is None else budget.limit()
    except ValueError:
        return []
    if limit is None:
        return []
    return [o for o in (*plan.observations, *plan.provisional) if o.kv_cache_memory_bytes > limit]


def applicable_kv_cache_memory_bytes(plan: Plan, current_free_memory: int) -> int | None:
    """The KV-cache bytes to apply, or None when no observation may be applied (``gate``)."""
    best, _ = gate(plan, current_free_memory)
    return None if best is None else best.kv_cache_memory_bytes
