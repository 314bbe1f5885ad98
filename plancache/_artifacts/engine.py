"""What every kind loaded as code or trusted as fact shares on the configured stores: the
settings, the sources and destinations, the one read loop, the one write (create-if-absent,
under a claim), metrics, background uploads and the clean-up of killed uploads.

Settings (besides the plans' ``PLANCACHE_URL``, local tier, read-only mode and keys):

- ``PLANCACHE_COMPILE_CACHE``: 1 or 0; default: on wherever the vLLM plugin is enabled.
- ``PLANCACHE_COMPILE_TRUST_UNSIGNED``: 1 to install unsigned artifacts from a remote store
  when no key is configured (default 0: loading an artifact executes its code).
- ``PLANCACHE_COMPILE_MAX_BYTES``: cap on an artifact's files (default 4 GiB).
- ``PLANCACHE_COMPILE_TIMEOUT``: seconds a fetch may take in all (default 60; past it, the
  node compiles as usual).
- ``PLANCACHE_COMPILE_EXIT_WAIT``: seconds an upload in flight may delay the process's exit
  (default 30; then it is abandoned and nothing is stored).

Stores: the local tier first (when one is configured), then the store ``PLANCACHE_URL``
names (``sources``). An upload writes the remote store (never in read-only mode), then the
local tier (``destinations``), each create-if-absent: the first object stored for a name
serves everyone. Every object is judged by the one trust rule (``trust``).

Lying stores: the store is opened as plans' is (``Settings.open_store``: lazily, behind the
conformance guard, read-only mode), so a remote object store is written (uploads,
retractions) only when the conformance probe found it honest (``_backends.guarded``), unless
``PLANCACHE_TRUST_PRECONDITIONS=1``; the probe runs on the upload's background thread, never
on a fetch's path, which reads only a verdict already known.

Guarantees of ``Engine.read``: it never raises; a source the trust rule would refuse unread
is listed, not read (``untrusted`` only where it lists something); a failure is classified
by its type into a reason (``Refused``: ``untrusted`` or ``invalid``; ``TooSlow``: ``slow``;
past the deadline: ``timeout``; another ``ArtifactError``: ``invalid``; anything else:
``store-error``; each logged with control characters escaped: ``_redaction.printable``), and
a slow or timed-out fetch reads nothing more. Nothing here knows a backend: the stores are
asked through their generic hooks (``ObjectLayer.remove_stale_temp_files``, ...) and the
plans store's ``local_tier``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from plancache import _background as background
from plancache import _events as events
from plancache import _metrics as metrics
from plancache._artifacts.manifest import DEFAULT_MAX_BYTES, Manifest
from plancache._artifacts.pacing import TimedOut, TooSlow
from plancache._artifacts.trust import Refused, Trust, warn_foreign
from plancache._background import Job
from plancache._claims import claim, release
from plancache._config import Settings, is_remote
from plancache._defaults import (
    COMPILE_EXIT_WAIT,
    COMPILE_MAX_BYTES,
    COMPILE_TIMEOUT,
    COMPILE_TRUST_UNSIGNED,
    DEFAULT_EXIT_WAIT_S,
    DEFAULT_FETCH_S,
)
from plancache._objects import ObjectLayer, Opened
from plancache._reasons import INSTALLED, Reason
from plancache._redaction import printable
from plancache._store import PlanStore
from plancache.errors import (
    ArtifactError,
    JobTimeout,
    PlanStoreError,
    PlanStoreReadOnlyError,
)

log = logging.getLogger("plancache")
T = TypeVar("T")


@dataclass(frozen=True)
class CompileSettings:
    """The ``PLANCACHE_COMPILE_*`` settings (see the module docstring)."""

    enabled: bool = True
    trust_unsigned: bool = False
    max_bytes: int = DEFAULT_MAX_BYTES
    fetch_timeout: float = DEFAULT_FETCH_S
    exit_wait: float = DEFAULT_EXIT_WAIT_S

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CompileSettings:
        """Raises ``ConfigError`` naming a malformed variable."""
        from plancache._switches import compile_on

        env = os.environ if environ is None else environ
        return cls(
            compile_on(env),
            COMPILE_TRUST_UNSIGNED.read(env),
            COMPILE_MAX_BYTES.read(env),
            COMPILE_TIMEOUT.read(env),
            COMPILE_EXIT_WAIT.read(env),
        )


@dataclass(frozen=True)
class Fetched:
    """What a fetch did: ``manifest`` installed (None: nothing), from ``source``, the reason
    (one of ``FETCH_REASONS``: ``hit``, ``miss``, ``present``, ``untrusted``, ``invalid``,
    ``store-error``, ``timeout``, ``slow``: it could not beat compiling) and the seconds it
    took."""

    reason: Reason
    manifest: Manifest | None = None
    source: str = ""
    seconds: float = 0.0


@dataclass(frozen=True)
class CacheFetched:
    """What a cache fetch did: the reason (``hit``: a bundle at least was installed, else as
    ``Fetched``'s), the bundles read and the files (and bytes) installed, the files the
    node had already with the bundles' bytes (``skipped``, ``skipped_bytes``), the paths of
    those it had with other bytes or as something else (``differing``: kept as they are,
    never replaced), every path a later upload leaves out (``known``: those the bundles read
    list, and ``found``), the paths the directory held before the fetch that no bundle lists
    (``found``: not this run's, so never uploaded as if it were; empty where the caller did
    not look), and the seconds it took."""

    reason: Reason
    bundles: int = 0
    installed: int = 0
    known: frozenset[str] = frozenset()
    seconds: float = 0.0
    installed_bytes: int = 0
    skipped: int = 0
    skipped_bytes: int = 0
    differing: tuple[str, ...] = ()
    found: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Source:
    """A place objects are read from: its label, object layer, and whether it is local
    (trusted without a signature where only this user or root could write it)."""

    label: str
    layer: ObjectLayer
    local: bool


@dataclass
class Read(Generic[T]):
    """What ``Engine.read`` did: the reason (see ``Fetched``), the source it ends with, and
    what was installed (one item per object installed; none where it was ``present``)."""

    reason: Reason = Reason.MISS
    source: str = ""
    got: list[T] = field(default_factory=list)

    def failed(self, reason: Reason, source: str) -> None:
        """A failure's reason, unless something was installed already."""
        if self.reason not in INSTALLED:
            self.reason, self.source = reason, source


def failure(exc: Exception, timed_out: bool) -> Reason:
    """The reason of a read that raised ``exc`` (``timed_out``: its deadline had passed or
    its caller stopped waiting)."""
    if not isinstance(exc, ArtifactError):
        return Reason.STORE_ERROR
    if timed_out or isinstance(exc, TimedOut):
        return Reason.TIMEOUT
    if isinstance(exc, TooSlow):
        return Reason.SLOW
    return exc.reason if isinstance(exc, Refused) else Reason.INVALID


def count(kind: str, reason: Reason, seconds: float, manifest: Manifest | None = None) -> None:
    """The metrics of one fetch (``plancache._metrics``): the decision; on a hit, the bytes
    and the seconds saved against the producer's recorded cost; on a fetch given up, the
    seconds it cost."""
    model = manifest.labels.get("model", "") if manifest is not None else ""
    events.decision(kind, reason, seconds, model)
    if reason is Reason.HIT and manifest is not None:
        metrics.moved(kind, "fetched", manifest.total_size)
        cost = manifest.producer.get("compile_s")
        if isinstance(cost, int | float) and not isinstance(cost, bool):
            metrics.saved(kind, float(cost) - seconds, model)
    elif reason in (Reason.SLOW, Reason.TIMEOUT):
        metrics.lost(kind, seconds, model)


class Engine(Trust):
    """The kinds' common ground on the configured stores (see the module docstring), under
    the one trust rule (``Trust``: ``refusal``, ``may_download``): ``store`` is the object
    layer of the stack ``Settings.open_store`` builds (``opened``: the store
    ``PLANCACHE_URL`` names, behind the conformance guard and read-only mode), ``local`` its
    local tier's layer. A kind's operations are an object built on an engine (composition:
    ``plancache._artifacts.kind``), never a subclass of it."""

    def __init__(
        self, settings: Settings, compile: CompileSettings, store: PlanStore | None = None
    ) -> None:
        self.settings, self.compile = settings, compile
        self.opened = settings.open_store() if store is None else store
        super().__init__(settings.keyring, compile.trust_unsigned, self.opened.layer)
        self.local: ObjectLayer | None = self.opened.local_tier
        self.remote = is_remote(settings.url)

    def sources(self) -> list[Source]:
        """Where reads look, in reading order: the local tier, then the store."""
        out = [Source("local-tier", self.local, True)] if self.local is not None else []
        return [*out, Source("store", self.store, not self.remote)]

    def destinations(self) -> list[tuple[str, ObjectLayer]]:
        """Where uploads and retractions write: the store (its object layer refuses writes
        in read-only mode and where the conformance probe found no honest store), then the
        local tier."""
        out: list[tuple[str, ObjectLayer]] = [("store", self.store)]
        if self.local is not None:
            out.append(("local-tier", self.local))
        return out

    def read(
        self,
        what: str,
        names: Callable[[ObjectLayer], Iterable[str]],
        install: Callable[[Source, str, Opened], T | None],
        *,
        every: bool = False,
        deadline: float | None = None,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> Read[T]:
        """The one read loop of every kind (``what`` names it in log lines): in each source
        the trust rule does not refuse unread, each object ``names(layer)`` lists is opened
        and passed to ``install`` (its result: what was installed; None: it was there
        already), until one is installed (every one with ``every``), a read is slow, or
        ``deadline`` (monotonic) passes. A source the trust rule refuses unread is listed,
        never read: ``untrusted`` where ``names`` found something there, a miss where it
        found nothing (a first boot). Never raises (see the module docstring)."""
        out: Read[T] = Read()
        for source in self.sources():
            try:
                listed = list(names(source.layer))
            except Exception as exc:  # the node builds what it needs as usual
                out.failed(Reason.STORE_ERROR, source.label)
                log.warning(
                    "plancache: %s from %s: %s: %s",
                    what,
                    source.label,
                    type(exc).__name__,
                    printable(str(exc)),
                )
                continue
            if listed and not self.may_download(source.local):
                out.failed(Reason.UNTRUSTED, source.label)
                continue  # found, refused, not even downloaded
            for name in listed:
                if deadline is not None and time.monotonic() > deadline:
                    out.failed(Reason.TIMEOUT, source.label)
                    return out
                reason, got = self._attempt(what, source, name, install, deadline, cancelled)
                if reason in INSTALLED:
                    out.reason, out.source = reason, source.label
                    out.got.extend([] if got is None else [got])
                    if not every:
                        return out
                elif reason is not Reason.MISS:
                    out.failed(reason, source.label)
                    if reason in (Reason.TIMEOUT, Reason.SLOW):
                        return out
        return out

    def _attempt(
        self,
        what: str,
        source: Source,
        name: str,
        install: Callable[[Source, str, Opened], T | None],
        deadline: float | None,
        cancelled: Callable[[], bool],
    ) -> tuple[Reason, T | None]:
        """Open ``name`` in ``source`` and install it: the reason and what was installed."""
        opened: Opened | None = None
        try:
            opened = source.layer.open_object(name)
            if opened is None:
                return Reason.MISS, None
            try:
                got = install(source, name, opened)
            finally:
                opened.close()
        except Exception as exc:  # refused, corrupt, slow, store errors: the node builds it
            late = deadline is not None and time.monotonic() > deadline
            reason = failure(exc, late or cancelled())
            if reason is Reason.UNTRUSTED and opened is not None and opened.foreign is not None:
                warn_foreign(f"{source.layer.url}/{name}", opened.foreign)  # once per place
            elif reason is Reason.STORE_ERROR:
                log.warning(
                    "plancache: %s %s from %s: %s: %s",
                    what,
                    name,
                    source.label,
                    type(exc).__name__,
                    printable(str(exc)),
                )
            else:
                log.warning(
                    "plancache: %s %s from %s not installed: %s",
                    what,
                    name,
                    source.label,
                    printable(str(exc)),
                )
            return reason, None
        return (Reason.HIT if got is not None else Reason.PRESENT), got

    def write(
        self,
        kind: str,
        what: str,
        name: str,
        packed: Callable[[], tuple[Manifest, Iterator[bytes]]],
        *,
        local_errors_raise: bool = False,
    ) -> dict[str, bool]:
        """Write ``name`` (``packed()``: its manifest and stream) to each destination
        (``write_once``), counted as a write of ``kind``; {destination: created}. A store
        that refuses writes is logged (``what`` names the kind); other store errors of the
        local tier raise if ``local_errors_raise``, else are logged."""
        out: dict[str, bool] = {}
        for label, layer in self.destinations():
            try:
                out[label] = self.write_once(label, layer, name, packed)
            except PlanStoreError as exc:
                strict = local_errors_raise and not isinstance(exc, PlanStoreReadOnlyError)
                if strict and label == "local-tier":
                    raise
                log.warning("plancache: %s: not written to the %s: %s", what, label, exc)
        self.written(kind, out)
        return out

    def write_once(
        self,
        label: str,
        layer: ObjectLayer,
        name: str,
        packed: Callable[[], tuple[Manifest, Iterator[bytes]]],
    ) -> bool:
        """Write object ``name`` (``packed()``: its manifest and stream) create-if-absent,
        looking first: False, with nothing streamed, where it is stored already or (on the
        store) another node holds the claim to upload it (see ``claims``); under the claim
        it looks again (the last holder may have finished between the two)."""
        there = layer.open_object(name)
        if there is not None:
            there.close()
            return False
        manifest, chunks = packed()
        if label == "local-tier":
            return layer.write_object(name, chunks)
        held = claim(layer, name, manifest.total_size)
        if held is None:
            log.info("plancache: %s: another node is uploading it; not uploaded here", name)
            return False
        try:
            there = layer.open_object(name)  # a holder that finished just before this claim
            if there is not None:
                there.close()
                return False
            return layer.write_object(name, chunks)
        finally:
            release(layer, name, held)

    def write_small(self, kind: str, what: str, name: str, data: bytes) -> dict[str, bool]:
        """Write a small object (an envelope: no claim, no manifest) create-if-absent to
        each destination, counted as a write of ``kind``; {destination: created}. Each
        destination's write returns within ``compile.fetch_timeout`` seconds over any
        backend (past it: ``timeout``, logged, the destination left out; a stalled call
        may still store the object later, whole or not at all). Never raises: what a
        destination refuses or fails is logged (``what`` names the kind)."""
        out: dict[str, bool] = {}
        bound = self.compile.fetch_timeout
        for label, layer in self.destinations():

            def write(stop: threading.Event, layer: ObjectLayer = layer) -> bool:
                return layer.write_object(name, [data])

            try:
                out[label] = background.within(write, bound, f"plancache-{kind}-write")
            except JobTimeout:
                log.warning(
                    "plancache: %s: not written to the %s within %g s: timeout", what, label, bound
                )
            except Exception as exc:
                log.warning("plancache: %s: not written to the %s: %s", what, label, exc)
        self.written(kind, out)
        return out

    @staticmethod
    def written(kind: str, out: dict[str, bool]) -> None:
        """The metric of one upload: created, kept (stored already), or nowhere."""
        where = out.get("store", out.get("local-tier"))
        metrics.write(kind, "nowhere" if where is None else "created" if where else "kept")

    def remove_stale_uploads(self, name: str) -> None:
        """Remove the temp files that killed uploads of ``name`` left in the local tier and
        in a store that is not remote (the stores' own clean-up: ``remove_stale_temp_files``)."""
        for layer in filter(None, [self.local, None if self.remote else self.store]):
            with contextlib.suppress(PlanStoreError):
                layer.remove_stale_temp_files(name=name)

    def close(self) -> None:
        self.opened.close()


class Uploads:
    """Background uploads of one process: jobs on daemon threads (``plancache._background``),
    waited for at exit at most ``exit_wait`` seconds in all (``wait``); past it they are
    abandoned (an abandoned upload stores nothing: see ``plancache._objects``). Each names
    what it carries (``what``), so what was abandoned can be said."""

    def __init__(self) -> None:
        self.jobs: list[tuple[str, Job[object]]] = []
        self.lock = threading.Lock()

    def start(self, what: str, target: Callable[..., object], *args: object) -> Job[object]:
        """``target(*args)`` on a daemon thread: an upload of ``what`` (e.g. "model info")."""
        job = background.start(functools.partial(target, *args), "plancache-compile-upload")
        with self.lock:
            self.jobs.append((what, job))
        return job

    def running(self) -> list[Job[object]]:
        """The uploads not done yet."""
        with self.lock:
            return [job for _, job in self.jobs if not job.done()]

    def unfinished(self) -> list[str]:
        """What the uploads not done yet carry, each named once, in the order started."""
        with self.lock:
            return list(dict.fromkeys(what for what, job in self.jobs if not job.done()))

    def wait(self, timeout: float) -> bool:
        """Join every upload, ``timeout`` seconds in all; True if none is left running."""
        deadline = time.monotonic() + timeout
        with self.lock:
            jobs = [job for _, job in self.jobs]
        return all([job.join(deadline - time.monotonic()) for job in jobs])
