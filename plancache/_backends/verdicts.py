"""Conformance verdicts kept beyond one probe: cached on this node's disk (``VerdictCache``,
only this user's taken) and shared with the fleet in the store (``share``, ``read_shared``).

A verdict is about one store at one endpoint (``identity``). ``honest`` and ``lies`` are kept
for ``VERDICT_TTL_S``; a shared one is taken only if it is about the same endpoint, younger
than ``VERDICT_TTL_S`` (allowing ``CLOCK_SKEW_S``), and, where keys are set, signed by an
accepted key. A verdict's detail, from a file or the store, is logged escaped and cut.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from plancache._defaults import CLOCK_SKEW_S as CLOCK_SKEW_S
from plancache._defaults import VERDICT_TTL_S
from plancache._directory import Directory
from plancache._neighbours import OddFileError, read_file
from plancache._objects import CREATE, ObjectLayer, Update
from plancache._probe import ProbeResult, StoreVerdict
from plancache._redaction import printable, scrub
from plancache._signing import Keyring
from plancache.errors import PlanStoreError, PlanStoreUnavailableError

log = logging.getLogger("plancache")

VERDICTS_DIR = "conformance"
"""The subdirectory of the local directory that holds cached verdicts."""
SHARED_VERDICT = "verdict.json"
"""The object, under the probe prefix, that holds the last prober's verdict for every node."""
SHARED_LIMIT = 4096
"""Most bytes read of a shared verdict."""
KEPT = (StoreVerdict.HONEST, StoreVerdict.LIES)


class VerdictCache:
    """Verdicts of stores, one JSON file each in ``directory``, fresh for ``ttl`` seconds.
    Fail-open: a file that cannot be read or written is no verdict. Only this user's are
    taken (``plancache._neighbours``: the directory and the file owned by this user or root
    and writable by no one else, regular, at most ``SHARED_LIMIT`` bytes); another's is no
    verdict (one warning), so a neighbour can neither stop this node's writes nor stall it."""

    def __init__(self, directory: Path, ttl: float = VERDICT_TTL_S) -> None:
        self.directory = directory
        self.ttl = ttl
        self._warned = False

    def _name(self, identity: str) -> str:
        return f"{hashlib.sha256(identity.encode()).hexdigest()[:32]}.json"

    def load(self, identity: str) -> tuple[ProbeResult, float] | None:
        """The fresh verdict cached for ``identity`` and its age in seconds, or None."""
        relative = f"{self.directory.name}/{self._name(identity)}"
        try:
            read = read_file(self.directory.parent, relative, SHARED_LIMIT)
            if read is None:
                return None
            if read.foreign is not None:
                self._refuse(read.foreign)
                return None
            data = orjson.loads(read.data)
            result = ProbeResult(StoreVerdict(data["verdict"]), data["step"], detail(data))
            age = time.time() - float(data["at"])
        except OddFileError as exc:
            self._refuse(str(exc))
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if result.verdict not in KEPT or not isinstance(result.step, str | None):
            return None
        return (result, age) if 0 <= age < self.ttl else None

    def _refuse(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "plancache: cached conformance verdicts in %s not used: %s (the store is "
                "probed instead)",
                self.directory,
                printable(why),
            )

    def save(self, identity: str, store: str, result: ProbeResult, at: float | None = None) -> None:
        """Cache ``result``, found at ``at`` (default: now), atomically (a temp file renamed)
        in a directory only this user may write (made so where this user owns it), through
        its guarded handle (``plancache._directory``); failures are logged."""
        record = {
            "store": store,
            "verdict": result.verdict.value,
            "step": result.step,
            "detail": result.detail,
            "at": time.time() if at is None else at,
        }
        try:
            with Directory.make(self.directory.parent, self.directory.name, mode=0o700) as held:
                held.private(0o700)
                held.write(self._name(identity), orjson.dumps(record))
        except OSError as exc:
            log.warning("plancache: conformance verdict not cached in %s: %s", self.directory, exc)


MAX_DETAIL_CHARS = 500
"""A verdict's detail as logged: at most this many characters, control characters escaped."""


def detail(record: Mapping[str, Any]) -> str:
    """The detail of a verdict record read from a file or the store, safe to log."""
    return printable(str(record["detail"]))[:MAX_DETAIL_CHARS]


def identity(store: ObjectLayer) -> str:
    """What a verdict is about: the store's URL and the endpoint its client talks to (none
    where the layer declares none)."""
    return f"{store.url}\n{store.endpoint() or ''}"


def endpoint_id(ident: str) -> str:
    """``identity`` as a shared verdict names it (a hash: no endpoint in the store)."""
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


_LOOK = object()
UNREADABLE = object()
"""The version of a shared verdict the store refused to serve (see the module)."""


def share(
    store: ObjectLayer,
    keyring: Keyring,
    result: ProbeResult,
    stored: object = _LOOK,
    *,
    replace_unreadable: bool = False,
) -> None:
    """Write ``result`` as ``store``'s shared verdict (see the module), over the one stored
    (compare-and-swap on ``stored``, its version, None if absent; default: read it first.
    Of two nodes replacing it at once, one wins). One the store refuses to serve
    (``UNREADABLE``) is left alone, unless ``replace_unreadable`` (``plancache doctor``):
    then it is deleted and the verdict created. A node that checks signatures but holds no
    signing key shares nothing (its nodes would not take it); ``keyring`` signs it. Never
    raises."""
    if keyring.requires_signature and not keyring.can_sign:
        return
    if stored is UNREADABLE and not replace_unreadable:
        return
    record: dict[str, Any] = {
        "verdict": result.verdict.value,
        "step": result.step,
        "detail": result.detail,
        "at": time.time(),
        "endpoint": endpoint_id(identity(store)),
    }
    if keyring.can_sign:
        payload = orjson.dumps(record, option=orjson.OPT_SORT_KEYS)
        record["signature"] = keyring.sign_payload(payload).to_dict()
    layer = store.probe_store()
    if layer is None:  # no probe, no verdict to share
        return
    try:
        if stored is _LOOK:
            try:
                found = layer.read_object(SHARED_VERDICT, SHARED_LIMIT)
                stored = None if found is None else found[1]
            except PlanStoreUnavailableError:
                raise
            except PlanStoreError:
                if not replace_unreadable:
                    raise
                stored = UNREADABLE
        if stored is UNREADABLE:
            layer.delete_object(SHARED_VERDICT)
            stored = None
        mode = CREATE if stored is None else Update(stored)
        layer.write_object(SHARED_VERDICT, (orjson.dumps(record),), mode)
    except Exception as exc:  # fail-open: the next node probes too
        log.debug("plancache: %s: verdict not shared: %s", store.url, scrub(str(exc)))
