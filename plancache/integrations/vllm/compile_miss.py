"""Why a compile artifact missed: a node whose fetch found no artifact under its key compares
what its key is made of (``compiling.aot_factors``: vLLM's compile env factors, config,
Inductor's factors, the forward) with the factors stored artifacts of the same rank carry
(the label ``FACTORS_LABEL``, written at upload), and logs the differences with the nearest
one, while vLLM compiles. Where the keys require signatures only validly signed artifacts
are compared (``CompileArtifacts.others``); what a stored artifact says (factor names and
values, its producer's host) is logged escaped (``_redaction.printable``) and cut short.
The miss that moved ``HOME`` or put a pod's address in the key is named, not silent.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from plancache import _background as background
from plancache._artifacts.manifest import NAME_PREFIX
from plancache._artifacts.store import ArtifactStore
from plancache._keys import ABSENT, Scalar, differences
from plancache._redaction import printable
from plancache.integrations.vllm.apply import safely
from plancache.integrations.vllm.compiling import aot_factors

log = logging.getLogger("plancache.vllm")

FACTORS_LABEL = "factors"
"""The artifact label that holds what its key is made of (``compiling.aot_factors``)."""
MAX_NAMED = 6
"""Differing factors a miss's log line names."""


def name_miss_later(
    opened: Callable[[], ArtifactStore | None], key: str, rank: str, model: Any, label: object
) -> None:
    """Compute ``model``'s factors now, then ``name_miss`` in a daemon thread."""
    mine = aot_factors(model)
    background.start(
        functools.partial(safely, name_miss, opened, key, rank, mine, label),
        "plancache-compile-miss",
    )


def name_miss(
    opened: Callable[[], ArtifactStore | None],
    key: str,
    rank: str,
    mine: dict[str, Scalar],
    model: object,
) -> None:
    """Log why the store held no artifact of (key, rank): the factors in which the nearest
    stored artifact of this rank (of this model where one is) was made differently, ``mine``
    being this node's (``compiling.aot_factors``); ``opened`` gives the store. For a daemon
    thread while vLLM compiles."""
    artifacts = opened()
    if artifacts is None:
        return
    others = artifacts.others(key, rank)
    with_factors = [m for m in others if isinstance(m.labels.get(FACTORS_LABEL), dict)]
    if not with_factors:
        log.info(
            "plancache: compile artifact %s/%s: miss: the store holds %s of %s under another key%s",
            key[:12],
            rank,
            len(others) or "no artifact",
            rank,
            " (made before plancache recorded their factors)" if others else "",
        )
        return
    same = [m for m in with_factors if m.labels.get("model") == model] or with_factors
    ranked = [(m, differences(m.labels[FACTORS_LABEL], mine)) for m in same]
    manifest, differ = min(ranked, key=lambda md: (len(md[1]), -md[0].created_at))
    shown = "; ".join(
        f"{printable(d.factor)[:80]}: {_shown(d.stored)} -> {_shown(d.given)}"
        for d in differ[:MAX_NAMED]
    )
    log.warning(
        "plancache: compile artifact %s/%s: miss: the nearest stored one (%s, from %s) was "
        "made under a key that differs in %d factors: %s%s; vLLM compiles",
        key[:12],
        rank,
        manifest.name.removeprefix(NAME_PREFIX)[:12],
        printable(str(manifest.producer.get("host", "?")))[:80],
        len(differ),
        shown or "none recorded (code or compiler state outside the factors)",
        "; ..." if len(differ) > MAX_NAMED else "",
    )


def _shown(value: object) -> str:
    return "(absent)" if value is ABSENT else printable(repr(value))[:80]
