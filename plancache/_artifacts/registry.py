"""The one registry of the kinds the inventory and the commands iterate over, in the order
they are shown (``KINDS``). A kind is declared where it lives (its module's ``Kind`` value,
``plancache._artifacts.kind``) and registered here by one line; nothing else names it.

Guarantees of ``register``: a kind's name and object prefix are its own (no two kinds can
claim one object name by prefix), and registering is the only way into ``KINDS``.
"""

from __future__ import annotations

from plancache._artifacts import bundles, compiled, modelinfo, reports
from plancache._artifacts.kind import Kind

KINDS: list[Kind] = []
"""Every registered kind, in registration order (the order ``ls`` and ``stats`` show)."""


def register(kind: Kind) -> Kind:
    """Add ``kind`` after those registered; ``ValueError`` where its name is taken or its
    object prefix overlaps another kind's (one would list the other's objects)."""
    for known in KINDS:
        if known.name == kind.name or known.prefix.startswith(kind.prefix):
            raise ValueError(f"kind {kind.name!r} ({kind.prefix}...) overlaps {known.name!r}")
        if kind.prefix.startswith(known.prefix):
            raise ValueError(f"kind {kind.name!r} ({kind.prefix}...) overlaps {known.name!r}")
    KINDS.append(kind)
    return kind


def unregister(kind: Kind) -> None:
    """Remove ``kind`` (a test's own, registered for its duration)."""
    KINDS.remove(kind)


register(compiled.COMPILE_ARTIFACTS)
register(bundles.CACHE_BUNDLES)
register(modelinfo.MODEL_INFO)
register(reports.BOOT_REPORTS)
