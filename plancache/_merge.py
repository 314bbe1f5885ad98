"""How records merge: the dominance order between observations and the bounded frontier (pure).

An observation *dominates* another when it allocated at least as much KV cache from a baseline
no higher, and is strictly better in one of the two: wherever the other applies, it applies
too and serves more. Merging two records keeps the union of their observations minus the
dominated ones (the Pareto frontier), so the merge is commutative and idempotent, and
associative while the frontier fits ``MAX_OBSERVATIONS`` points: writers that race in any
order end on the same record.

The bound: a frontier of more than ``MAX_OBSERVATIONS`` points drops interior points, one at a
time, always the one whose KV cache exceeds its lower-baseline neighbour's by the least (the
capacity a node between the two gives up by applying the neighbour instead). The
lowest-baseline point (coverage: every node that could apply anything still can) and the
largest-KV point are never dropped. Points equal in both numbers keep the one whose canonical
encoding sorts first, so every writer picks the same.

Provisional observations (``Plan.provisional``: measured by boots that compiled during
profiling) form a second frontier, bounded by ``MAX_PROVISIONAL``, merged the same way, minus
every point that a (warm) observation of the merged record covers: a boot that compiles may
apply either kind, so a warm point at least as good makes the provisional one redundant,
while no provisional point ever drops a warm one.

Retraction: a record's tombstones (``Plan.retracted``) name observations that must never be
applied again. The merge takes the union of both records' tombstones (a digest in both keeps
its latest retraction time; past ``MAX_TOMBSTONES`` the ones retracted longest ago are dropped,
ties by digest) and removes every observation a kept tombstone names before taking the
frontier. So a retracted observation never comes back through the merge of an older copy (a
node's local tier, ``plancache cp`` from a stale directory) while its tombstone is kept.
A tombstone dated more than ``TOMBSTONE_SKEW_S`` after the merging node's clock is dropped,
never ranked (``Tombstone.believable``): a clock that far ahead, or a planted date up to year
9999, would otherwise outrank every real retraction for good. A retraction (``retract``)
always takes effect: its own tombstone is kept even where the record holds ``MAX_TOMBSTONES``
that rank higher (the lowest-ranked one makes room); it stays until ``MAX_TOMBSTONES``
tombstones dated later evict it.

With tombstones the merge stays commutative and idempotent; it stays associative unless a
tombstone names a point that dominated another: a merge that ran before the retraction had
already dropped the dominated point, and the retraction does not bring it back (the record is
then smaller, never wrong). The skew bound depends on the clock: for one ``now`` these laws
hold on the records it accepts (a record carrying tombstones past the bound merges with itself
into that record without them; one holding nothing else is invalid, ``Plan.decode``); as the
clock advances the bound only admits more, so records merged at different times converge.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import orjson

from plancache._keys import Scalar
from plancache._observation import Observation, Tombstone
from plancache._plan import MAX_LABELS, MAX_OBSERVATIONS, MAX_PROVISIONAL, MAX_TOMBSTONES, Plan
from plancache.errors import InvalidArgumentError


def at_least_as_good(a: Observation, b: Observation) -> bool:
    """The one order between observations: ``a`` allocated at least as much KV cache from a
    baseline no higher (wherever ``b`` applies, ``a`` applies too and serves as much)."""
    return (
        a.kv_cache_memory_bytes >= b.kv_cache_memory_bytes
        and a.free_memory_baseline <= b.free_memory_baseline
    )


def dominates(new: Observation, old: Observation) -> bool:
    """True if ``new`` makes ``old`` redundant: ``at_least_as_good`` and strictly better in
    one of the two numbers."""
    return at_least_as_good(new, old) and not at_least_as_good(old, new)


def covers(frontier: Iterable[Observation], observation: Observation) -> bool:
    """True if some point of ``frontier`` is ``at_least_as_good`` as ``observation`` (is it,
    or dominates it): a node that measured ``observation`` can apply at least as much."""
    return any(at_least_as_good(o, observation) for o in frontier)


def frontier(
    observations: Iterable[Observation], bound: int = MAX_OBSERVATIONS
) -> tuple[Observation, ...]:
    """The non-dominated observations sorted by baseline, at most ``bound`` (>= 2) of them,
    chosen as the module docstring says. A function of the set alone (order-independent)."""
    if bound < 2:
        raise InvalidArgumentError(f"a frontier keeps at least 2 points, got bound={bound}")
    unique: dict[tuple[int, int], Observation] = {}
    for o in observations:
        key = (o.free_memory_baseline, o.kv_cache_memory_bytes)
        if key not in unique or o.encode() < unique[key].encode():
            unique[key] = o
    points = sorted(
        unique.values(), key=lambda o: (o.free_memory_baseline, -o.kv_cache_memory_bytes)
    )
    kept: list[Observation] = []
    for o in points:  # the last point kept has the largest KV of those kept, at a baseline <= o's
        if not kept or not at_least_as_good(kept[-1], o):
            kept.append(o)
    while len(kept) > bound:
        drop = min(
            range(1, len(kept) - 1),
            key=lambda i: (
                kept[i].kv_cache_memory_bytes - kept[i - 1].kv_cache_memory_bytes,
                kept[i].encode(),
            ),
        )
        del kept[drop]
    return tuple(kept)


def merge_labels(a: Mapping[str, Scalar], b: Mapping[str, Scalar]) -> dict[str, Scalar]:
    """The union of two label sets; a name with two values keeps the one whose JSON sorts
    first, and past ``MAX_LABELS`` names the first ones in name order stay (deterministic)."""
    merged: dict[str, Scalar] = {}
    for name in sorted({*a, *b})[:MAX_LABELS]:
        values = [m[name] for m in (a, b) if name in m]
        merged[name] = min(values, key=orjson.dumps)
    return merged


def tombstones(
    retracted: Iterable[Tombstone], bound: int = MAX_TOMBSTONES, *, now: float | None = None
) -> tuple[Tombstone, ...]:
    """The union of tombstones, one per digest (its latest retraction), the ``bound`` most
    recently retracted ones, sorted by digest; those not ``believable`` at ``now`` (default:
    the current time) are dropped first. For one ``now``, a function of the set alone."""
    latest: dict[str, Tombstone] = {}
    for t in retracted:
        if not t.believable(now):
            continue
        old = latest.get(t.observation)
        if old is None or (t.retracted_at, t.created_at) > (old.retracted_at, old.created_at):
            latest[t.observation] = t
    kept = sorted(latest.values(), key=lambda t: (-t.retracted_at, t.observation))[:bound]
    return tuple(sorted(kept, key=lambda t: t.observation))


def merge(stored: Plan, new: Plan, *, now: float | None = None) -> Plan:
    """The record that holds both: the union of their tombstones (``tombstones``, judged at
    ``now``, default the current time), the frontier of their observations that no kept
    tombstone names, the frontier of their provisional ones that no kept tombstone names
    and no kept observation covers, and their labels merged. Commutative and idempotent
    (see the module docstring); ``ValueError`` for records of different keys."""
    if stored.fingerprint != new.fingerprint:
        raise InvalidArgumentError("cannot merge records of different fingerprints")
    tombs = tombstones((*stored.retracted, *new.retracted), now=now)
    dead = {t.observation for t in tombs}
    alive = (o for o in (*stored.observations, *new.observations) if o.digest not in dead)
    warm = frontier(alive)
    provisional = frontier(
        (
            o
            for o in (*stored.provisional, *new.provisional)
            if o.digest not in dead and not covers(warm, o)
        ),
        MAX_PROVISIONAL,
    )
    return Plan(
        stored.fingerprint,
        stored.factors,
        warm,
        merge_labels(stored.labels, new.labels),
        retracted=tombs,
        provisional=provisional,
    )


def retract(plan: Plan, observation: Observation, at: float, *, now: float | None = None) -> Plan:
    """``plan`` without ``observation`` and with its tombstone (retracted at ``at``). The
    tombstone is added even when the record does not hold the observation, so that no later
    merge brings it in, and it is always kept: where ``MAX_TOMBSTONES`` others rank higher,
    the lowest-ranked of them makes room. Other tombstones are judged at ``now`` as in
    ``merge``."""
    mine = Tombstone.of(observation, at)
    tombs = tombstones((*plan.retracted, mine), now=now)
    if mine.observation not in {t.observation for t in tombs}:
        tombs = (*tombstones(plan.retracted, MAX_TOMBSTONES - 1, now=now), mine)
    return Plan(
        plan.fingerprint,
        plan.factors,
        tuple(o for o in plan.observations if o.digest != mine.observation),
        plan.labels,
        retracted=tuple(sorted(tombs, key=lambda t: t.observation)),
        provisional=tuple(o for o in plan.provisional if o.digest != mine.observation),
    )
