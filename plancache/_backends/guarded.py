"""Never write through a store that ignores the preconditions of conditional writes.

``GuardedStore`` wraps a layer that declares where the conformance probe writes
(``ObjectLayer.probe_store``: the built-in S3 and GCS backends, and any registered backend
that declares one). Reads and listings go straight through: no probe
ever runs on a lookup's path. Warming the store (``warm``: when a writable store opens, in
the plugin while the weights load) or else its first write of any kind (a put, rewrite or
delete of a plan, also one that the stored record turns into no write at all; an object
written or deleted through the object layer, e.g. a compile artifact) starts a *round* in a
daemon thread, unless a fresh verdict for this store (URL and endpoint) is known; a write
waits for the round. Then, per verdict:

- ``honest``: writes go through;
- ``lies``: one ERROR line names the store and the step that failed, and every write raises
  ``StoreIgnoresPreconditionsError`` (a ``PlanStoreReadOnlyError``: a tiered store goes on
  reading and writing its local tier, as with ``PLANCACHE_READ_ONLY``);
- ``read-only`` (the credentials may not write): writes raise ``PlanStoreReadOnlyError``;
- ``unknown`` (a timeout, a server error, a store too loaded to answer): the next round may
  start after a backoff (``RETRY_MIN_S``, doubling at each ``unknown`` in a row up to
  ``RETRY_S``). A write waits for a verdict up to ``patience`` seconds (``open_guarded``
  gives ``WRITE_PATIENCE_S``: every write of a node is off its boot's path), a round after
  each backoff; with none by then, or after ``MAX_ROUNDS`` rounds without a verdict, it
  raises ``PlanStoreUnavailableError`` (a plan stays marked in the local tier and is offered
  again at the next boot).

**The herd's load is bounded.** A round is (``Round``): the verdict cached on this node's
disk, else one read of the verdict another node shared (``SHARED_VERDICT`` under the probe
prefix); where there is none, the *probe claim* (``plancache._claims``, the upload claims'
mechanism, on the shared verdict's name, lasting ``PROBE_CLAIM_S``): the one node holding it
reads the shared verdict again (the last holder may just have shared it), else probes
(``plancache._probe``), shares the verdict it found and releases the claim; every
other node re-reads the shared verdict, at most ``REREADS`` times ``REREAD_S`` seconds
apart (doubling), within the probe's bound, and probes nothing. A round that cannot read
the shared verdict or claim (the store does not answer) sends nothing more. So the fleet
runs at most one probe of a store at a time (a prober that dies blocks the others for
``PROBE_CLAIM_S``), and a node's round costs at most ``ROUND_CALLS`` store calls
(``HOLDER_CALLS`` for the claim's holder). What a process knows of a store (the verdict,
the backoff, the round running, the rounds spent) is one ``Conformance``, shared by every
``GuardedStore`` of the same store and local directory in the process: its plans, compile
artifacts and boot reports wait for the same round and back off once.

``honest`` and ``lies`` are cached on disk (``<local dir>/conformance/``, one small JSON file
per store) and in memory for ``VERDICT_TTL_S`` (one day); the others only in memory, for
their backoff (``unknown``) or ``RETRY_S`` (``read-only``). A shared verdict is taken only
if it is about the same endpoint, younger than ``VERDICT_TTL_S``, and, where keys are set,
signed by an accepted key (the prober signs it with the signing key where one is set);
anything else is no verdict. A shared verdict the store refuses to serve (403, e.g. stored
in an archive storage class) is probed past, and such a node shares nothing (it cannot
replace what it cannot read); ``plancache doctor`` replaces it (``share(...,
replace_unreadable=True)``).

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
    CLOCK_SKEW_S,
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
from plancache._claims import CLAIM_CALLS, claim, release
from plancache._defaults import (
    PROBE_CLAIM_S,
    PROBE_JITTER_S,
    PROBE_TIMEOUT_S,
    REREAD_S,
    RETRY_MIN_S,
    RETRY_S,
    VERDICT_TTL_S,
    WRITE_PATIENCE_S,
)
from plancache._forwarding import ForwardingLayer
from plancache._objects import CREATE, ObjectLayer, WriteMode
from plancache._probe import PROBE_CALLS, ProbeResult, StoreVerdict, probe
from plancache._redaction import scrub
from plancache._signing import NO_KEYS, Keyring
from plancache.errors import (
    PlanStoreError,
    PlanStorePermissionError,
    PlanStoreReadOnlyError,
    PlanStoreUnavailableError,
)
from plancache.errors import StoreIgnoresPreconditionsError as StoreIgnoresPreconditionsError

log = logging.getLogger("plancache")

REREADS = 3
"""Most re-reads of the shared verdict in a round without the probe claim."""
MAX_ROUNDS = 6
"""Most rounds a process runs on one store without finding ``honest`` or ``lies``."""
ROUND_CALLS = 1 + CLAIM_CALLS + REREADS
"""Most store calls of a round without the probe claim (read, claim, re-reads)."""
HOLDER_CALLS = 1 + CLAIM_CALLS + 1 + PROBE_CALLS + 2
"""Most store calls of the probe claim's holder's round (read, claim, read again, probe,
share, release)."""
TRUST_VARIABLE = "PLANCACHE_TRUST_PRECONDITIONS"
"""The setting that writes without (or despite) the probe."""

NOT_DONE = ProbeResult(StoreVerdict.UNKNOWN, None, "the conformance probe is not done")


class Conformance:
    """What one process knows of one store's conformance (see the module): the verdict and
    until when it holds, ``unknown`` rounds in a row (the backoff), rounds without a kept
    verdict (``MAX_ROUNDS``), the round running. Shared by every ``GuardedStore`` of the
    store in the process (``conformance``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.result: ProbeResult | None = None
        self.expires = 0.0
        self.unknowns = 0
        self.rounds = 0
        self.running: Job[None] | None = None
        self.hurry = threading.Event()
        """Set by a write that waits for the verdict: a round still in its delay starts."""

    def fresh(self) -> ProbeResult | None:
        """The verdict still held (past ``MAX_ROUNDS``: the last one, for good), else None.
        Call with ``lock`` held."""
        if self.result is None:
            return None
        if time.monotonic() < self.expires or self.rounds >= MAX_ROUNDS:
            return self.result
        return None

    def keep(self, result: ProbeResult, expires: float, early: bool, retry_s: float) -> None:
        """Keep ``result``, valid ``expires`` seconds (an ``unknown``: the backoff instead,
        or none after an ``early`` round, so that the first write runs a round of its own)."""
        with self.lock:
            if result.verdict in KEPT:
                self.unknowns = self.rounds = 0
            else:
                self.rounds += 1
            if result.verdict is StoreVerdict.UNKNOWN:
                if early:
                    expires = 0.0
                else:
                    backoff = min(retry_s, RETRY_MIN_S * 2**self.unknowns)
                    expires = random.uniform(0.5, 1.0) * backoff
                    self.unknowns += 1
            self.result = result
            self.expires = time.monotonic() + expires


_known: dict[tuple[str, str | None], Conformance] = {}
_known_lock = threading.Lock()


def conformance(ident: str, verdicts: VerdictCache | None) -> Conformance:
    """The process's one ``Conformance`` of the store ``ident`` for the node whose verdicts
    ``verdicts`` caches (its local directory: nodes simulated in one process stay apart)."""
    key = (ident, None if verdicts is None else str(verdicts.directory))
    with _known_lock:
        return _known.setdefault(key, Conformance())


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
        retry_s: float | None = None,
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
        self.retry_s = RETRY_S if retry_s is None else retry_s
        self.patience = patience
        self.ident = identity(store)
        self.state = conformance(self.ident, verdicts)
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
        module). Waits for the round where no verdict is known yet."""
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
        with self.state.lock:
            held = self.state.fresh()
        if held is not None and held.verdict in KEPT:
            return held
        cached = self.verdicts.load(self.ident) if self.verdicts is not None else None
        return None if cached is None else cached[0]

    def known_to_ignore_preconditions(self) -> bool:
        """True if the verdict already known says ``lies`` (never probes; False when
        trusting the store's preconditions)."""
        known = None if self.trust else self.known()
        return known is not None and known.verdict is StoreVerdict.LIES

    def warm(self) -> None:
        """Start a round now, on a daemon thread (where writes are wanted and no fresh
        verdict is known), after a random delay of up to ``PROBE_JITTER_S`` (the nodes of a
        rollout do not read in the same second; a write that needs the verdict first cuts
        it short), so that the first write finds its verdict; returns at once."""
        if self.probe_on_warm and not self.trust:
            self._start_round(random.uniform(0.0, PROBE_JITTER_S), early=True)
        super().warm()

    def _start_round(self, delay: float = 0.0, early: bool = False) -> Job[None] | ProbeResult:
        """The verdict held, else the process's round on this store (started now if none
        runs, ``delay`` seconds late; ``early``: before any write asked)."""
        state = self.state
        with state.lock:
            held = state.fresh()
            if held is not None:
                return held
            if state.running is None or state.running.done():
                state.running = background.start(
                    functools.partial(self._round, delay, early), "plancache-probe"
                )
            return state.running

    def verdict(self) -> ProbeResult:
        """The store's verdict: the one held, else that of the round running or started now
        (waiting for it at most the round's bound or the patience left). Where it found none,
        once more for a round of its own if that was an early round, and again after each
        backoff for up to ``patience`` seconds (at most ``MAX_ROUNDS`` rounds in all)."""
        deadline = time.monotonic() + self.patience
        bound = self.probe_timeout + PROBE_CLAIM_S
        while True:
            running = self._start_round()
            if isinstance(running, ProbeResult):
                result = running
            else:
                self.state.hurry.set()  # a warm-up's round waiting out its delay starts now
                if not running.join(max(bound, deadline - time.monotonic())):
                    return NOT_DONE
                with self.state.lock:
                    result = self.state.result or NOT_DONE
            if result.verdict is not StoreVerdict.UNKNOWN:
                return result
            with self.state.lock:
                wait = self.state.expires - time.monotonic()
                spent = self.state.rounds >= MAX_ROUNDS
            if spent:
                return result
            if wait <= 0:
                continue  # an early round's: once more, for a round of this write's own
            if time.monotonic() + wait > deadline:
                return result
            time.sleep(wait)

    def _round(self, delay: float = 0.0, early: bool = False) -> None:
        """One round (see the module), ``delay`` seconds from now (a write that waits for it
        cuts the delay short); its verdict kept for the process (``Conformance.keep``)."""
        self.state.hurry.wait(delay)
        try:
            result, expires = Round(self).run()
        except Exception as exc:  # e.g. the client could not open: no verdict
            result = ProbeResult(StoreVerdict.UNKNOWN, None, scrub(f"{type(exc).__name__}: {exc}"))
            expires = self.retry_s
        self.state.keep(result, expires, early, self.retry_s)
        self._report(result)

    def probe_target(self) -> ObjectLayer:
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
                "plancache: %s: conformance probe: %s (%s); not written until a later round "
                "finds it honest",
                self.url,
                result.verdict.value,
                where,
            )


class Round:
    """One round of ``guard`` (see the module): ``run`` gives (verdict, seconds it holds)."""

    def __init__(self, guard: GuardedStore) -> None:
        self.guard = guard
        self.layer = guard.probe_target()
        self.stored: object = None
        """The shared verdict's version as last read (None: absent)."""

    def run(self) -> tuple[ProbeResult, float]:
        g = self.guard
        cached = g.verdicts.load(g.ident) if g.verdicts is not None else None
        if cached is not None:
            return cached[0], VERDICT_TTL_S - cached[1]
        found = self.look()
        if found is not None:
            return found
        try:
            held = claim(self.layer, SHARED_VERDICT, 0, base_s=PROBE_CLAIM_S)
        except PlanStorePermissionError as exc:
            why = scrub(f"the probe claim was refused: {exc}")
            return ProbeResult(StoreVerdict.READ_ONLY, "claim", why), g.retry_s
        except PlanStoreError as exc:
            return self.unknown(f"the probe claim could not be made: {exc}"), g.retry_s
        deadline = time.monotonic() + g.probe_timeout
        if held is None:
            return self.await_verdict(deadline)
        try:
            found = self.look()  # the last holder may have shared it just before this claim
            if found is not None:
                return found
            result = probe(self.layer, timeout=g.probe_timeout)
            if result.verdict in KEPT:
                if g.verdicts is not None:
                    g.verdicts.save(g.ident, g.url, result)
                share(g.store, g.keyring, result, self.stored)
                return result, VERDICT_TTL_S
            return result, g.retry_s
        finally:
            release(self.layer, SHARED_VERDICT, held)

    def look(self) -> tuple[ProbeResult, float] | None:
        """The shared verdict taken (``shared``), or ``unknown`` where the store did not
        answer (a probe now would fail too, and load it); None where there is none to take
        (one the store refuses to serve is probed past)."""
        g = self.guard
        try:
            return self.shared()
        except PlanStoreUnavailableError as exc:
            return self.unknown(f"the shared verdict could not be read: {exc}"), g.retry_s
        except PlanStoreError as exc:  # it answered, and refused this object: probe past
            log.info(
                "plancache: %s: the shared verdict is unreadable (%s): probing; "
                "`plancache doctor` replaces it",
                g.url,
                scrub(str(exc)),
            )
            self.stored = UNREADABLE
            return None

    def unknown(self, why: str) -> ProbeResult:
        return ProbeResult(StoreVerdict.UNKNOWN, None, scrub(why))

    def await_verdict(self, deadline: float) -> tuple[ProbeResult, float]:
        """Another node holds the probe claim: its verdict, re-read at most ``REREADS``
        times, ``REREAD_S`` apart and doubling, before ``deadline``; else ``unknown``."""
        g, pause = self.guard, REREAD_S
        for _ in range(REREADS):
            if time.monotonic() + pause > deadline:
                break
            time.sleep(pause)
            pause *= 2
            try:
                shared = self.shared()
            except PlanStoreError as exc:
                return self.unknown(f"the shared verdict could not be read: {exc}"), g.retry_s
            if shared is not None:
                return shared
        why = "another node probes the store and shared no verdict yet"
        return self.unknown(why), g.retry_s

    def shared(self) -> tuple[ProbeResult, float] | None:
        """The verdict another node shared, if it may be taken (see the module), kept on
        this node's disk, and how long it holds; else None. Raises ``PlanStoreError`` where
        the store did not serve it."""
        g = self.guard
        found = self.layer.read_object(SHARED_VERDICT, SHARED_LIMIT)
        self.stored = None if found is None else found[1]
        if found is None:
            return None
        try:
            g.keyring.check_foreign(found[0])
            record = orjson.loads(found[0])
            result = ProbeResult(StoreVerdict(record["verdict"]), record["step"], detail(record))
            at, mine = float(record["at"]), record["endpoint"] == endpoint_id(g.ident)
        except Exception as exc:  # unreadable, unsigned where keys are set: this node probes
            log.debug("plancache: %s: shared verdict not taken: %s", g.url, scrub(str(exc)))
            return None
        fresh = -CLOCK_SKEW_S <= time.time() - at < VERDICT_TTL_S
        if not (mine and fresh and result.verdict in KEPT and isinstance(result.step, str | None)):
            return None
        log.debug("plancache: %s: verdict %s shared by a node", g.url, result.verdict.value)
        if g.verdicts is not None:
            g.verdicts.save(g.ident, g.url, result, at)
        return result, VERDICT_TTL_S - max(0.0, time.time() - at)


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
