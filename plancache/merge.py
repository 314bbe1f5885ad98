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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import orjson

from plancache.plan import MAX_LABELS, MAX_OBSERVATIONS, Observation, Plan, Scalar


def dominates(new: Observation, old: Observation) -> bool:
    """True if ``new`` makes ``old`` redundant: at least as much KV cache, a baseline no
    higher (applies on at least as many nodes), and strictly better in one of the two."""
    kv_ge = new.kv_cache_memory_bytes >= old.kv_cache_memory_bytes
    base_le = new.free_memory_baseline <= old.free_memory_baseline
    strict = (
        new.kv_cache_memory_bytes > old.kv_cache_memory_bytes
        or new.free_memory_baseline < old.free_memory_baseline
    )
    return kv_ge and base_le and strict


def covers(frontier: Iterable[Observation], observation: Observation) -> bool:
    """True if some point of ``frontier`` is ``observation`` or dominates it in both numbers:
    a node that measured ``observation`` can apply at least as much KV cache."""
    return any(
        o.kv_cache_memory_bytes >= observation.kv_cache_memory_bytes
        and o.free_memory_baseline <= observation.free_memory_baseline
        for o in frontier
    )


def frontier(
    observations: Iterable[Observation], bound: int = MAX_OBSERVATIONS
) -> tuple[Observation, ...]:
    """The non-dominated observations sorted by baseline, at most ``bound`` (>= 2) of them,
    chosen as the module docstring says. A function of the set alone (order-independent)."""
    if bound < 2:
        raise ValueError(f"a frontier keeps at least 2 points, got bound={bound}")
    unique: dict[tuple[int, int], Observation] = {}
    for o in observations:
        key = (o.free_memory_baseline, o.kv_cache_memory_bytes)
        if key not in unique or o.encode() < unique[key].encode():
            unique[key] = o
    points = sorted(
        unique.values(), key=lambda o: (o.free_memory_baseline, -o.kv_cache_memory_bytes)
    )
    kept: list[Observation] = []
    for o in points:
        if not kept or o.kv_cache_memory_bytes > kept[-1].kv_cache_memory_bytes:
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


def merge(stored: Plan, new: Plan) -> Plan:
    """The record that holds both: the frontier of their observations and their labels
    merged. Commutative and idempotent; ``ValueError`` for records of different keys."""
    if stored.fingerprint != new.fingerprint:
        raise ValueError("cannot merge records of different fingerprints")
    return Plan(
        stored.fingerprint,
        stored.factors,
        frontier((*stored.observations, *new.observations)),
        merge_labels(stored.labels, new.labels),
    )
