"""Never write through a store that ignores the preconditions of conditional writes.

``GuardedStore`` wraps a layer that declares where the conformance probe writes
(``ObjectLayer.probe_store``: the built-in S3 and GCS backends, and any registered backend
that declares one). Reads and listings go straight through: no probe
ever runs on a lookup's path. Warming the store (``warm``: when a writable store opens, in
the plugin while the weights load) or else its first write of any kind (a put, rewrite or
delete of a plan, also one that the stored record turns into no write at all; an object
written or deleted through the object layer, e.g. a compile artifact) starts the conformance
probe (``plancache._probe``) in a daemon thread, unless a fresh verdict for this store (URL
and endpoint) is cached in the local directory; a write waits for the verdict (at most the
probe's own bound, ``PROBE_TIMEOUT_S``), which a probe started at the opening has usually
found by then. Then, per verdict:

- ``honest``: writes go through;
- ``lies``: one ERROR line names the store and the step that failed, and every write raises
  ``StoreIgnoresPreconditionsError`` (a ``PlanStoreReadOnlyError``: a tiered store goes on
  reading and writing its local tier, as with ``PLANCACHE_READ_ONLY``);
- ``read-only`` (the credentials may not write): writes raise ``PlanStoreReadOnlyError``;
- ``unknown`` (a timeout, a server error, a store too loaded to answer): the next probe
  may start after a backoff (``RETRY_MIN_S``, doubling at each ``unknown`` in a row up to
  ``RETRY_S``). A write waits for a verdict up to ``patience`` seconds (``open_guarded``
  gives ``WRITE_PATIENCE_S``: every write of a node is off its boot's path, a save after the
  warm-up, an upload after the compile, each bounded at exit), probing again after each
  backoff; with none by then it raises ``PlanStoreUnavailableError`` (a plan stays marked in
  the local tier and is offered again at the next boot). So a rollout whose store is too
  loaded for any probe to conclude at first shares what its nodes measured and compiled once
  the store answers again, within the same boots, instead of never.

``honest`` and ``lies`` are cached on disk (``<local dir>/conformance/``, one small JSON file
per store) and in memory for ``VERDICT_TTL_S`` (one day); the others only in memory, for
their backoff (``unknown``) or ``RETRY_S`` (``read-only``). They are also shared between
nodes: the prober writes its verdict to the store (``SHARED_VERDICT`` under the probe
prefix, signed with the signing key where one is set), and a node without a verdict of its
own reads it before probing: one request instead of a probe's 20-27 requests, where a
rollout's nodes would all probe at once. A shared verdict is taken only if it is about the
same endpoint, younger than ``VERDICT_TTL_S``, and, where keys are set, signed by an accepted
key; anything else is no verdict and the node probes. Only a store that does not answer
(``PlanStoreUnavailableError``) stops a node from probing: a shared verdict the store
refuses to serve (403, e.g. stored in an archive storage class) is probed past, and such a
node shares nothing (it cannot replace what it cannot read); ``plancache doctor`` replaces it
(``share(..., replace_unreadable=True)``).

``trust=True`` (``PLANCACHE_TRUST_PRECONDITIONS=1``) skips the probe and writes
anyway, logging a WARNING at every open: on a store that ignores preconditions, concurrent
writers then lose observations and tombstones.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson

from plancache import _background as background
from plancache._backends import open_layer
from plancache._backends.verdicts import (
    KEPT,
    SHARED_LIMIT,
    SHARED_VERDICT,
    UNREADABLE,
    VERDICTS_DIR,
    VerdictCache,
    detail,
    endpoint_id,
    identity,
    share,
)
from plancache._background import Job
from plancache._defaults import (
    BACKOFF_S,
    CLOCK_SKEW_S,
    PROBE_JITTER_S,
    PROBE_TIMEOUT_S,
    RETRY_MIN_S,
    RETRY_S,
    VERDICT_TTL_S,
    WRITE_PATIENCE_S,
)
from plancache._forwarding import ForwardingLayer
from plancache._objects import CREATE, ObjectLayer, WriteMode
from plancache._probe import ProbeResult, StoreVerdict, probe
from plancache._redaction import scrub
from plancache._signing import NO_KEYS, Keyring
from plancache.errors import PlanStoreError, PlanStoreReadOnlyError, PlanStoreUnavailableError
from plancache.errors import StoreIgnoresPreconditionsError as StoreIgnoresPreconditionsError

log = logging.getLogger("plancache")

PROBE_ATTEMPTS = 3
"""A probe without a verdict (a timeout, HTTP 503 SlowDown, 429) is tried again, up to this
many in all, after about ``BACKOFF_S`` doubling each time, within its bound."""
MAX_WAITS = 16
"""Most probes one write waits for."""
TRUST_VARIABLE = "PLANCACHE_TRUST_PRECONDITIONS"
"""The setting that writes without (or despite) the probe."""


class GuardedStore(ForwardingLayer):
    """``store`` written only once the conformance probe found it honest (see the module):
    reads and listings go to it (``ForwardingLayer``), each write or delete asks
    ``check_writable`` first; ``keyring`` signs the verdict it shares and judges the one it
    reads."""

    def __init__(
        self,
        store: ObjectLayer,
        verdicts: VerdictCache | None,
        *,
        trust: bool = False,
        probe_timeout: float = PROBE_TIMEOUT_S,
        retry_s: float = RETRY_S,
        probe_on_warm: bool = True,
        patience: float = 0.0,
        keyring: Keyring = NO_KEYS,
    ) -> None:
        self.store = store
        self.keyring = keyring
        self.verdicts = verdicts
        self.trust = trust
        self.probe_on_warm = probe_on_warm
        self.probe_timeout = probe_timeout
        self.retry_s = retry_s
        self.patience = patience
        self._unknowns = 0
        """``unknown`` verdicts in a row (the backoff before the next probe)."""
        self._lock = threading.Lock()
        self._result: ProbeResult | None = None
        self._expires = 0.0
        self._probing: Job[None] | None = None
        self._hurry = threading.Event()
        """Set by a write that waits for the verdict: a probe still in its delay starts."""
        self._stored: object = None
        """The shared verdict's version when this node last read it (None: absent)."""
        if trust:
            log.warning(
                "plancache: %s=1: writing to %s without checking that it honours conditional "
                "writes; if it does not, concurrent writers lose observations and tombstones",
                TRUST_VARIABLE,
                self.url,
            )

    @property
    def inner(self) -> ObjectLayer:
        return self.store

    # -- reads go through; writes wait for the verdict ---------------------------------------

    def write_object(self, name: str, chunks: Iterable[bytes], mode: WriteMode = CREATE) -> bool:
        self.check_writable()
        return super().write_object(name, chunks, mode)

    def delete_object(self, name: str, version: object | None = None) -> bool:
        self.check_writable()
        return super().delete_object(name, version)

    def check_writable(self) -> None:
        """Return if the store may be written; else raise what the verdict says (see the
        module). Waits for the probe where no verdict is known yet."""
        if self.trust:
            return
        result = self.verdict()
        why = f"{result.step}: {result.detail}" if result.step else result.detail
        if result.verdict is StoreVerdict.LIES:
            raise StoreIgnoresPreconditionsError(
                f"{self.url} ignores write preconditions ({why}): not written "
                f"(check it with `plancache doctor`; {TRUST_VARIABLE}=1 writes anyway)"
            )
        if result.verdict is StoreVerdict.READ_ONLY:
            raise PlanStoreReadOnlyError(f"{self.url}: the credentials may not write ({why})")
        if result.verdict is StoreVerdict.UNKNOWN:
            raise PlanStoreUnavailableError(
                f"{self.url}: not written: the conformance probe gave no verdict ({why})"
            )

    def known(self) -> ProbeResult | None:
        """The verdict already known (in memory or cached on disk), without probing; None
        if there is none. For read paths, which never probe."""
        with self._lock:
            if self._result is not None and time.monotonic() < self._expires:
                return self._result
        cached = self.verdicts.load(identity(self.store)) if self.verdicts is not None else None
        return None if cached is None else cached[0]

    def known_to_ignore_preconditions(self) -> bool:
        """True if the verdict already known says ``lies`` (never probes; False when
        trusting the store's preconditions)."""
        known = None if self.trust else self.known()
        return known is not None and known.verdict is StoreVerdict.LIES

    def warm(self) -> None:
        """Start the probe now, on a daemon thread (where writes are wanted and no fresh
        verdict is known), after a random delay of up to ``PROBE_JITTER_S`` (the nodes of a
        rollout do not probe in the same second; a write that needs the verdict first cuts
        it short), so that the first write finds its verdict; returns at once."""
        if self.probe_on_warm and not self.trust:
            self._start_probe(random.uniform(0.0, PROBE_JITTER_S), early=True)
        super().warm()

    def _start_probe(self, delay: float = 0.0, early: bool = False) -> Job[None] | ProbeResult:
        """The fresh verdict known, else the probe running (started now if need be, ``delay``
        seconds late; ``early``: before any write asked, see ``_probe``)."""
        with self._lock:
            if self._result is not None and time.monotonic() < self._expires:
                return self._result
            if self._probing is None or self._probing.done():
                self._probing = background.start(
                    functools.partial(self._probe, delay, early), "plancache-probe"
                )
            return self._probing

    def verdict(self) -> ProbeResult:
        """The store's verdict: the one known, else that of a probe started now or already
        running (waiting at most ``probe_timeout`` seconds for it). Where it found none, once
        more for a probe of its own if that was an early probe, and again after each backoff
        for up to ``patience`` seconds (at most ``MAX_WAITS`` probes)."""
        deadline = time.monotonic() + self.patience
        result = ProbeResult(StoreVerdict.UNKNOWN, None, "the conformance probe is not done")
        for attempt in range(MAX_WAITS):
            probing = self._start_probe()
            if isinstance(probing, ProbeResult):
                result = probing
            else:
                self._hurry.set()  # a warm-up's probe waiting out its delay starts now
                if not probing.join(self.probe_timeout + 1.0):
                    return ProbeResult(
                        StoreVerdict.UNKNOWN, None, "the conformance probe is not done"
                    )
                result = self._result or result
            if result.verdict is not StoreVerdict.UNKNOWN:
                return result
            with self._lock:
                wait = self._expires - time.monotonic()
            if wait <= 0 and attempt == 0:
                continue  # an early probe's: once more, for a probe of this write's own
            if time.monotonic() + max(0.0, wait) > deadline:
                break
            time.sleep(max(0.0, wait))
        return result

    def _probe(self, delay: float = 0.0, early: bool = False) -> None:
        """Find the verdict (cached on disk, else by a probe, ``delay`` seconds from now)
        and keep it in memory; a write that waits for it cuts the delay short. No verdict
        from an ``early`` probe (the boot's busiest seconds) is kept for no time: the first
        write probes again rather than fail for ``retry_s``."""
        self._hurry.wait(delay)
        try:
            result, expires = self._find()
        except Exception as exc:  # e.g. the client could not open: no verdict
            result = ProbeResult(StoreVerdict.UNKNOWN, None, scrub(f"{type(exc).__name__}: {exc}"))
            expires = self.retry_s
        with self._lock:
            if result.verdict is not StoreVerdict.UNKNOWN:
                self._unknowns = 0
            elif early:
                expires = 0.0
            else:
                backoff = min(expires, RETRY_MIN_S * 2**self._unknowns)
                expires = random.uniform(0.5, 1.0) * backoff
                self._unknowns += 1
            self._result = result
            self._expires = time.monotonic() + expires
        self._report(result)

    def _find(self) -> tuple[ProbeResult, float]:
        """(verdict, seconds it stays valid)."""
        ident = identity(self.store)
        cached = self.verdicts.load(ident) if self.verdicts is not None else None
        if cached is not None:
            return cached[0], VERDICT_TTL_S - cached[1]
        deadline = time.monotonic() + self.probe_timeout
        result = ProbeResult(StoreVerdict.UNKNOWN, None, "not probed")
        for attempt in range(PROBE_ATTEMPTS):  # a store that sheds load (503, 429) answers later
            if attempt:
                pause = random.uniform(0.5, 1.5) * BACKOFF_S * 2 ** (attempt - 1)
                if deadline - time.monotonic() - pause < 1.0:
                    break
                time.sleep(pause)
            try:
                shared = self._shared(ident)
            except PlanStoreUnavailableError as exc:  # a probe now would fail too, and load it
                why = scrub(f"the shared verdict could not be read: {exc}")
                result = ProbeResult(StoreVerdict.UNKNOWN, None, why)
                continue
            except PlanStoreError as exc:  # it answered, and refused this object: probe past
                log.info(
                    "plancache: %s: the shared verdict is unreadable (%s): probing; "
                    "`plancache doctor` replaces it",
                    self.url,
                    scrub(str(exc)),
                )
                self._stored, shared = UNREADABLE, None
            if shared is not None:
                found, at = shared
                if self.verdicts is not None:
                    self.verdicts.save(ident, self.url, found, at)
                return found, VERDICT_TTL_S - max(0.0, time.time() - at)
            result = probe(self._probe_store(), timeout=deadline - time.monotonic())
            if result.verdict is not StoreVerdict.UNKNOWN:
                break
        if result.verdict in KEPT:
            if self.verdicts is not None:
                self.verdicts.save(ident, self.url, result)
            share(self.store, self.keyring, result, self._stored)
            return result, VERDICT_TTL_S
        return result, self.retry_s

    def _shared(self, ident: str) -> tuple[ProbeResult, float] | None:
        """The verdict another node shared and when it was found, if it may be taken (see
        the module); else None (``self._stored``: the stored object's version, None if
        absent). Raises ``PlanStoreError`` where the store did not answer."""
        found = self._probe_store().read_object(SHARED_VERDICT, SHARED_LIMIT)
        self._stored = None if found is None else found[1]
        if found is None:
            return None
        try:
            self.keyring.check_foreign(found[0])
            record = orjson.loads(found[0])
            result = ProbeResult(StoreVerdict(record["verdict"]), record["step"], detail(record))
            at, mine = float(record["at"]), record["endpoint"] == endpoint_id(ident)
        except Exception as exc:  # unreadable, unsigned where keys are set: this node probes
            log.debug("plancache: %s: shared verdict not taken: %s", self.url, scrub(str(exc)))
            return None
        fresh = -CLOCK_SKEW_S <= time.time() - at < VERDICT_TTL_S
        if mine and fresh and result.verdict in KEPT and isinstance(result.step, str | None):
            log.debug("plancache: %s: verdict %s shared by a node", self.url, result.verdict.value)
            return result, at
        return None

    def _probe_store(self) -> ObjectLayer:
        """Where the probe writes (``ObjectLayer.probe_store``), asked afresh each time."""
        target = self.store.probe_store()
        if target is None:  # open_guarded guards only a layer that declares one
            raise PlanStoreError(f"{self.url}: the layer declares no probe store")
        return target

    def _report(self, result: ProbeResult) -> None:
        """One log line per verdict found: ERROR for ``lies``."""
        where = f"{result.step}: {result.detail}" if result.step else result.detail
        if result.verdict is StoreVerdict.LIES:
            log.error(
                "plancache: %s ignores write preconditions (failed step %s): writing nothing "
                "to it; lookups and the local tier go on (check it with `plancache doctor`; "
                "%s=1 writes anyway)",
                self.url,
                where,
                TRUST_VARIABLE,
            )
        elif result.verdict is StoreVerdict.HONEST:
            log.debug("plancache: %s honours write preconditions", self.url)
        else:
            log.warning(
                "plancache: %s: conformance probe: %s (%s); not written until a later probe "
                "finds it honest",
                self.url,
                result.verdict.value,
                where,
            )


def open_guarded(
    url: str,
    storage_options: Mapping[str, Any],
    local_dir: str | None,
    *,
    trust: bool = False,
    writable: bool = True,
    patience: float | None = None,
    keyring: Keyring = NO_KEYS,
) -> ObjectLayer:
    """``open_layer(url, **storage_options)``, a layer that declares a probe store
    (``ObjectLayer.probe_store``: an object store, a registered backend declaring one) behind
    a ``GuardedStore`` whose verdicts are cached under ``local_dir`` (None: in memory only),
    which probes when warmed where ``writable`` and whose writes wait up to ``patience``
    seconds (None: ``WRITE_PATIENCE_S``) for a verdict and whose shared verdicts ``keyring``
    signs and judges; other stores as they are."""
    store = open_layer(url, **storage_options)
    if store.probe_store() is None:
        return store
    verdicts = None if local_dir is None else VerdictCache(Path(local_dir) / VERDICTS_DIR)
    wait = WRITE_PATIENCE_S if patience is None else patience
    return GuardedStore(
        store, verdicts, trust=trust, probe_on_warm=writable, patience=wait, keyring=keyring
    )
