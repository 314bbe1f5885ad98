"""Fetch, install, upload and retract compile artifacts under plancache's settings (glue).

Settings (besides the plans' ``PLANCACHE_URL``, local tier, read-only mode and keys):

- ``PLANCACHE_COMPILE_CACHE``: 1 or 0; default: on wherever the vLLM plugin is enabled.
- ``PLANCACHE_COMPILE_TRUST_UNSIGNED``: 1 to install unsigned artifacts from a remote store
  when no key is configured (default 0: loading an artifact executes its code).
- ``PLANCACHE_COMPILE_MAX_BYTES``: cap on an artifact's files (default 4 GiB).
- ``PLANCACHE_COMPILE_TIMEOUT``: seconds a fetch may take in all (default 60; past it, the
  node compiles as usual).
- ``PLANCACHE_COMPILE_EXIT_WAIT``: seconds an upload in flight may delay the process's exit
  (default 30; then it is abandoned and nothing is stored).

Trust: with any signing or verify key configured, only artifacts validly signed by an
accepted key are installed, from any store. Without a key, artifacts from a local store or
the local tier are installed only where no other user could have written them (the
directory and the file owned by this user or root, neither writable by group or others:
``_backends.local.foreign_writers``; else refused with one warning naming the place and the
fix), and artifacts from a remote store only with ``PLANCACHE_COMPILE_TRUST_UNSIGNED=1``, and
never unsigned from a store the conformance probe found to ignore write preconditions
(``plancache._probe``).

Lying stores: the store is opened as plans' is (``Settings.open_store``: lazily, behind the
conformance guard, read-only mode), so a remote object store is written (uploads,
retractions) only when the conformance probe found it honest (``_backends.guarded``), unless
``PLANCACHE_TRUST_PRECONDITIONS=1``; the probe runs on the upload's background thread, never
on a fetch's path, which reads only a verdict already known.

Stores: the local tier first (when one is configured), then the store ``PLANCACHE_URL``
names. An upload writes the remote store (never in read-only mode), then the local tier,
each create-if-absent: the first artifact stored for a key serves everyone. A retraction
deletes only the version it judged.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from plancache import _background as background
from plancache import _metrics as metrics
from plancache._artifacts import modelinfo
from plancache._artifacts.archive import (
    Readable,
    install,
    install_cache,
    pack,
    pack_cache,
    read_manifest,
    remove_partial_installs,
    scan_cache,
)
from plancache._artifacts.manifest import (
    CACHE_PREFIX,
    DEFAULT_MAX_BYTES,
    Manifest,
    object_name,
    parse_cache_name,
)
from plancache._backends.guarded import GuardedStore
from plancache._backends.local import LocalStore
from plancache._backends.tiered import TieredStore
from plancache._background import Job
from plancache._config import Settings, is_remote
from plancache._objects import ObjectLayer, Opened, Update
from plancache._observation import Observation
from plancache._parse import parse_bool, parse_timeout
from plancache._probe import StoreVerdict
from plancache._signing import Keyring, SignatureVerdict
from plancache._store import PlanStore, beneath
from plancache.errors import ArtifactError, ConfigError, PlanStoreError, PlanStoreReadOnlyError

log = logging.getLogger("plancache")

DEFAULT_FETCH_S = 60.0
DEFAULT_EXIT_WAIT_S = 30.0
MARKS_DIR = "compile_marks"
"""The crash-loop breaker's marks for artifacts, in the node's local directory."""
MAX_BUNDLES = 64
"""Most bundles of one cache and scope a fetch reads from a source (the first in name
order); the node builds what they lack itself."""


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
        on = compile_on(env)
        size = env.get("PLANCACHE_COMPILE_MAX_BYTES", str(DEFAULT_MAX_BYTES)).strip()
        if not size.isdigit() or int(size) <= 0:
            raise ConfigError(f"PLANCACHE_COMPILE_MAX_BYTES={size!r}: expected bytes (> 0)")
        return cls(
            on,
            parse_bool(
                "PLANCACHE_COMPILE_TRUST_UNSIGNED", env.get("PLANCACHE_COMPILE_TRUST_UNSIGNED", "0")
            ),
            int(size),
            parse_timeout(
                "PLANCACHE_COMPILE_TIMEOUT",
                env.get("PLANCACHE_COMPILE_TIMEOUT", str(DEFAULT_FETCH_S)),
            ),
            parse_timeout(
                "PLANCACHE_COMPILE_EXIT_WAIT",
                env.get("PLANCACHE_COMPILE_EXIT_WAIT", str(DEFAULT_EXIT_WAIT_S)),
            ),
        )


def artifact_id(key: str, rank: str) -> str:
    """The 64-hex name of (key, rank) in the crash-loop breaker."""
    return hashlib.sha256(object_name(key, rank).encode()).hexdigest()


def as_observation(manifest: Manifest) -> Observation:
    """The breaker's handle on ``manifest`` (its marks name observations): the producer
    carries the object name and the manifest's digest, which covers every file."""
    return Observation(
        1, 1, manifest.created_at, {"artifact": manifest.name, "digest": manifest.digest}
    )


@dataclass
class Fetched:
    """What a fetch did: ``manifest`` installed (None: nothing), from ``source``, the reason
    (``hit``, ``miss``, ``present``, ``untrusted``, ``invalid``, ``store-error``, ``timeout``,
    ``slow``: it could not beat compiling) and the seconds it took."""

    reason: str
    manifest: Manifest | None = None
    source: str = ""
    seconds: float = 0.0


@dataclass
class CacheFetched:
    """What a cache fetch did: the reason (``hit``: a bundle at least was installed, else as
    ``Fetched``'s), the bundles and files installed, every path the bundles read list, and
    the seconds it took."""

    reason: str
    bundles: int = 0
    installed: int = 0
    known: set[str] = field(default_factory=set)
    seconds: float = 0.0


class _Deadline:
    """A reader that raises ``ArtifactError`` once ``deadline`` (monotonic) has passed or
    ``cancelled()`` says the caller stopped waiting."""

    def __init__(
        self, inner: Readable, deadline: float, cancelled: Callable[[], bool] = lambda: False
    ) -> None:
        self.inner, self.deadline, self.cancelled = inner, deadline, cancelled

    def read(self, n: int, /) -> bytes:
        if time.monotonic() > self.deadline:
            raise ArtifactError("fetch timed out")
        if self.cancelled():
            raise ArtifactError("the boot stopped waiting for it")
        return self.inner.read(n)


MIN_PACE_S = 1.0
"""Seconds a fetch streams before its pace may give it up (a rate needs a sample)."""


class _Pace:
    """A fetch's pace against the producer's compile time (``compile_s`` in the manifest's
    producer, where it is recorded): ``update`` raises ``ArtifactError`` once the time
    spent so far plus the rest at the rate seen cannot beat compiling."""

    def __init__(self, start: float) -> None:
        self.start, self.total, self.done = start, 0, 0
        self.budget: float | None = None

    def watching(self, judge: Callable[[Manifest], str | None]) -> Callable[[Manifest], str | None]:
        """``judge``, taking the manifest's size and compile time first."""

        def accept(manifest: Manifest) -> str | None:
            cost = manifest.producer.get("compile_s")
            self.total, self.budget = manifest.total_size, None
            if isinstance(cost, (int, float)) and not isinstance(cost, bool) and cost > 0:
                self.budget = float(cost)
            return judge(manifest)

        return accept

    def update(self, n: int) -> None:
        self.done += n
        elapsed = time.monotonic() - self.start
        if self.budget is None or elapsed < MIN_PACE_S:
            return
        projected = elapsed * self.total / self.done
        if projected > self.budget:
            raise ArtifactError(
                f"slower than compiling: {projected:.1f} s at the rate seen, against "
                f"{self.budget:.1f} s the producer took to compile"
            )


def _count(kind: str, fetched: Fetched) -> None:
    """The metrics of one fetch (``plancache._metrics``): the decision; on a hit, the bytes
    and the seconds saved against the producer's recorded cost; on a fetch given up, the
    seconds it cost."""
    manifest = fetched.manifest
    model = manifest.labels.get("model", "") if manifest is not None else ""
    metrics.decision(kind, fetched.reason, fetched.seconds, model)
    if fetched.reason == "hit" and manifest is not None:
        metrics.moved(kind, "fetched", manifest.total_size)
        cost = manifest.producer.get("compile_s")
        if isinstance(cost, int | float) and not isinstance(cost, bool):
            metrics.saved(kind, float(cost) - fetched.seconds, model)
    elif fetched.reason in ("slow", "timeout"):
        metrics.lost(kind, fetched.seconds, model)


def _written(kind: str, out: dict[str, bool]) -> None:
    """The metric of one upload: created, kept (stored already), or nowhere."""
    where = out.get("store", out.get("local-tier"))
    metrics.write(kind, "nowhere" if where is None else "created" if where else "kept")


JOIN_S = 1.0
"""Seconds a boot at its first forward still waits for a fetch that has not begun to stream
an accepted artifact: a store that did not answer while the weights loaded is not waited
for (one that streams is, until the pace or the deadline gives up)."""
FIRST_ANSWER_S = 5.0
"""Seconds from a fetch's start that a store has to begin streaming, however quickly the
weights loaded (a tiny model reaches its first forward at once)."""
_POLL_S = 0.05


def join_fetch(
    job: Job[Any],
    deadline: float,
    streaming: threading.Event,
    cancelled: threading.Event,
    started: float | None = None,
) -> bool:
    """Wait for ``job``, a fetch started at ``started`` (monotonic; default: now) before the
    first forward (``ArtifactStore.fetch`` with ``streaming`` and ``cancelled``): until
    ``deadline`` (monotonic) once it streams, else until ``JOIN_S`` from now or
    ``FIRST_ANSWER_S`` from its start, whichever is later. True if it ended; else
    ``cancelled`` is set (it installs nothing after this) and False."""
    now = time.monotonic()
    give_up = max(now + JOIN_S, (now if started is None else started) + FIRST_ANSWER_S)
    while not job.done():
        limit = deadline if streaming.is_set() else min(deadline, give_up)
        left = limit - time.monotonic()
        if left <= 0:
            cancelled.set()
            return False
        job.join(min(left, _POLL_S))
    return True


_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_foreign(where: str, why: str) -> None:
    """One warning per process and place: unsigned code from a place other users could
    have written is refused, and how to fix it."""
    with _warned_lock:
        if where in _warned:
            return
        _warned.add(where)
    log.warning(
        "plancache: compile artifacts in %s are not installed unsigned: %s; make the directory "
        "and its files this user's and not writable by group or others (chmod 755 / 644), or "
        "sign artifacts (PLANCACHE_SIGNING_KEY)",
        where,
        why,
    )


def lies(store: PlanStore) -> bool:
    """True if ``store`` is already known to ignore write preconditions (no probe is run:
    a fetch's path never probes)."""
    try:
        guards = [s for s in beneath(store) if isinstance(s, GuardedStore)]
    except Exception:  # cannot open the client: the fetch reports the store error
        return False
    known = guards[0].known() if guards and not guards[0].trust else None
    return known is not None and known.verdict is StoreVerdict.LIES


def _read_at_most(reader: Readable, limit: int) -> bytes:
    """At most ``limit`` bytes of ``reader``."""
    chunks: list[bytes] = []
    got = 0
    while got < limit and (chunk := reader.read(limit - got)):
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


CLAIM_SUFFIX = ".claim"
CLAIM_BASE_S = 120.0
CLAIM_BYTES_PER_S = float(1 << 20)
"""A claim lasts ``CLAIM_BASE_S`` plus the object's size at this rate (a slow uplink)."""


def claim(layer: ObjectLayer, name: str, size: int, now: float | None = None) -> object | None:
    """Claim the upload of ``name`` on ``layer``: the object ``<name>.claim`` created, or
    taken over once expired (compare-and-swap on the version read), holding its expiry. The
    claim's version, or None where another node holds a live claim. A node that dies while
    uploading blocks the others only until its claim expires."""
    now = time.time() if now is None else now
    body = orjson.dumps(
        {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "until": now + CLAIM_BASE_S + size / CLAIM_BYTES_PER_S,
        }
    )
    claimed = name + CLAIM_SUFFIX
    for _ in range(2):  # create; else take over an expired claim (once)
        if layer.write_object(claimed, [body]):
            found = layer.read_object(claimed, 4096)
            return None if found is None or found[0] != body else found[1]
        found = layer.read_object(claimed, 4096)
        if found is None:
            continue  # released meanwhile: try to create it again
        try:
            until = float(orjson.loads(found[0])["until"])
        except (ValueError, KeyError, TypeError):
            until = 0.0  # not a claim this reads: expired
        if until > now:
            return None
        if layer.write_object(claimed, [body], Update(found[1])):
            taken = layer.read_object(claimed, 4096)
            return None if taken is None or taken[0] != body else taken[1]
        return None
    return None


class ArtifactStore:
    """The compile artifacts kind on the configured stores (see the module docstring):
    ``store`` is the stack ``Settings.open_store`` builds (its object layer is the store
    ``PLANCACHE_URL`` names, behind the conformance guard and read-only mode), ``local`` its
    local tier."""

    def __init__(
        self, settings: Settings, compile: CompileSettings, store: PlanStore | None = None
    ) -> None:
        self.settings, self.compile = settings, compile
        self.keyring = settings.keyring
        self.store = settings.open_store() if store is None else store
        self.local: PlanStore | None = (
            self.store.local if isinstance(self.store, TieredStore) else None
        )
        self.remote = is_remote(settings.url)

    def _sources(self) -> list[tuple[str, ObjectLayer, bool]]:
        """(label, object layer, local: trusted without a signature where only this user
        or root could write it), in reading order."""
        out: list[tuple[str, ObjectLayer, bool]] = []
        if self.local is not None:
            out.append(("local-tier", self.local, True))
        out.append(("store", self.store, not self.remote))
        return out

    def judge(
        self, manifest: Manifest, local: bool, avoid: frozenset[str], foreign: str | None = None
    ) -> str | None:
        """None to install ``manifest`` (from a local source if ``local``; ``foreign``: why
        others could have written it there), else why not."""
        if as_observation(manifest).digest in avoid:
            return "gate:crashed-before (a boot on this node died with it)"
        return self.refusal(manifest.verdict, local, foreign)

    def refusal(
        self,
        verdict: Callable[[Keyring], SignatureVerdict],
        local: bool,
        foreign: str | None = None,
    ) -> str | None:
        """The trust rule of every kind loaded as code or trusted as fact: None to use an
        object (from a local source if ``local``; ``foreign``: why others could have written
        it there; ``verdict``: its signature's, under a keyring), else why not."""
        if self.keyring.requires_signature:
            judged = verdict(self.keyring)
            return None if judged is SignatureVerdict.VALID else f"invalid:signature ({judged})"
        if local:
            return None if foreign is None else f"untrusted: unsigned, and {foreign}"
        if not self.compile.trust_unsigned:
            return "untrusted: unsigned, from a remote store"
        if lies(self.store):
            return "untrusted: unsigned, from a store that ignores write preconditions"
        return None

    def fetch(
        self,
        target: Path,
        key: str,
        rank: str,
        avoid: frozenset[str] = frozenset(),
        *,
        deadline: float | None = None,
        cancelled: Callable[[], bool] = lambda: False,
        streaming: threading.Event | None = None,
    ) -> Fetched:
        """Install the artifact of (key, rank) into ``target`` (vLLM's ``<key>`` directory)
        from the first source that holds a trusted, valid one; first removes what killed
        installs left in ``target`` (``remove_partial_installs``). Gives up (``slow``) as
        soon as the stream cannot beat the producer's compile time, at ``deadline``
        (monotonic; default: the fetch bound from now; ``timeout``), and once
        ``cancelled()`` (nothing is installed after the caller stopped waiting). Sets
        ``streaming`` once a manifest is accepted (``join_fetch``). Never raises."""
        start = time.monotonic()
        deadline = start + self.compile.fetch_timeout if deadline is None else deadline
        name = object_name(key, rank)
        result = Fetched("miss")
        with contextlib.suppress(OSError):
            remove_partial_installs(target)
        self._remove_stale_uploads(name)
        for label, layer, local in self._sources():
            if not (local or self.compile.trust_unsigned or self.keyring.requires_signature):
                result = Fetched("untrusted", source=label)
                continue  # not even downloaded
            opened: Opened | None = None
            pace = _Pace(start)
            try:
                opened = layer.open_object(name)
                if opened is None:
                    continue
                judge = pace.watching(
                    functools.partial(self.judge, local=local, avoid=avoid, foreign=opened.foreign)
                )

                def accept(
                    manifest: Manifest, judge: Callable[[Manifest], str | None] = judge
                ) -> str | None:
                    why = judge(manifest)
                    if why is None and streaming is not None:
                        streaming.set()
                    return why

                try:
                    manifest = install(
                        _Deadline(opened, deadline, cancelled),
                        target,
                        key,
                        rank,
                        accept=accept,
                        max_bytes=self.compile.max_bytes,
                        progress=pace.update,
                        proceed=lambda: not cancelled(),
                    )
                finally:
                    opened.close()
            except ArtifactError as exc:
                timed_out = time.monotonic() > deadline or cancelled()
                untrusted = str(exc).startswith("artifact refused: untrusted")
                slow = str(exc).startswith("slower than compiling")
                reason = (
                    "timeout"
                    if timed_out
                    else "slow"
                    if slow
                    else "untrusted"
                    if untrusted
                    else "invalid"
                )
                result = Fetched(reason, source=label)
                if untrusted and opened is not None and opened.foreign is not None:
                    warn_foreign(f"{layer.url}/{name}", opened.foreign)  # once per place
                else:
                    log.warning(
                        "plancache: compile artifact %s from %s not installed: %s",
                        name,
                        label,
                        exc,
                    )
                if timed_out or slow:
                    break
                continue
            except Exception as exc:  # store errors, disk errors: the node compiles
                result = Fetched("store-error", source=label)
                log.warning(
                    "plancache: compile artifact %s from %s: %s: %s",
                    name,
                    label,
                    type(exc).__name__,
                    exc,
                )
                continue
            reason = "hit" if manifest is not None else "present"
            result = Fetched(reason, manifest, label)
            break
        result.seconds = time.monotonic() - start
        _count("compile_artifact", result)
        return result

    def fetch_model_info(self, name: str, module_hash: str, path: Path) -> Fetched:
        """Install the model-info file ``name`` (of a module whose source has
        ``module_hash``) at ``path`` from the first source that holds a trusted, valid one,
        never over a file there. Never raises."""
        start = time.monotonic()
        result = Fetched("miss")
        for label, layer, local in self._sources():
            if not (local or self.compile.trust_unsigned or self.keyring.requires_signature):
                result = Fetched("untrusted", source=label)
                continue
            try:
                opened = layer.open_object(name)
                if opened is None:
                    continue
                try:
                    data = _read_at_most(opened, modelinfo.MAX_BYTES + 1)
                finally:
                    opened.close()
                info = modelinfo.ModelInfo.decode(data)
                if info.name != name or info.module_hash != module_hash:
                    raise ArtifactError("model info of another module, class or source")
                why = self.refusal(info.verdict, local, opened.foreign)
                if why is not None:
                    untrusted = why.startswith("untrusted")
                    if untrusted and opened.foreign is not None:
                        warn_foreign(f"{layer.url}/{name}", opened.foreign)  # once per place
                    result = Fetched("untrusted" if untrusted else "invalid", source=label)
                    continue
                reason = "hit" if modelinfo.install(info, path) else "present"
            except ArtifactError as exc:
                result = Fetched("invalid", source=label)
                log.warning("plancache: model info %s from %s not installed: %s", name, label, exc)
                continue
            except Exception as exc:  # store errors, disk errors: vLLM inspects the class
                result = Fetched("store-error", source=label)
                log.warning("plancache: model info %s from %s: %s", name, label, exc)
                continue
            result = Fetched(reason, source=label)
            break
        result.seconds = time.monotonic() - start
        _count("model_info", result)
        return result

    def upload_model_info(self, info: modelinfo.ModelInfo) -> dict[str, bool]:
        """Store ``info`` create-if-absent on the store (unless it refuses writes: logged),
        then on the local tier; {destination: created}. Never raises."""
        out: dict[str, bool] = {}
        for label, layer in self._destinations():
            try:
                out[label] = layer.write_object(info.name, [info.encode()])
            except Exception as exc:
                log.warning("plancache: model info: not written to the %s: %s", label, exc)
        _written("model_info", out)
        return out

    def fetch_cache(
        self,
        kind: str,
        scope: str,
        root: Path,
    ) -> CacheFetched:
        """Install below ``root`` the files of every trusted, valid bundle of cache ``kind``
        in ``scope`` (at most ``MAX_BUNDLES`` a source), each file create-if-absent, within
        the fetch bound. The paths every bundle read lists (installed or not) are returned as
        ``known``: an upload leaves them out. Never raises."""
        start = time.monotonic()
        deadline = start + self.compile.fetch_timeout
        result = CacheFetched("miss")
        with contextlib.suppress(OSError):
            remove_partial_installs(root)
        prefix = f"{CACHE_PREFIX}{kind}_{scope}_"
        for label, layer, local in self._sources():
            if not (local or self.compile.trust_unsigned or self.keyring.requires_signature):
                result.reason = "untrusted"
                continue
            try:
                names = []
                for name in layer.list_objects(prefix):
                    if parse_cache_name(name) is not None:
                        names.append(name)
                    if len(names) >= MAX_BUNDLES or time.monotonic() > deadline:
                        break
            except Exception as exc:  # the node builds its cache as usual
                result.reason = "store-error"
                log.warning(
                    "plancache: %s cache from %s: %s: %s", kind, label, type(exc).__name__, exc
                )
                continue
            for name in sorted(names):
                if time.monotonic() > deadline:
                    result.reason = "timeout"
                    break
                self._install_bundle(layer, label, local, name, root, deadline, result)
        result.seconds = time.monotonic() - start
        metrics.decision(f"cache_{kind}", result.reason, result.seconds)
        return result

    def _install_bundle(
        self,
        layer: ObjectLayer,
        label: str,
        local: bool,
        name: str,
        root: Path,
        deadline: float,
        result: CacheFetched,
    ) -> None:
        kind, scope, _ = parse_cache_name(name) or ("", "", "")
        opened: Opened | None = None
        try:
            opened = layer.open_object(name)
            if opened is None:
                return
            foreign = opened.foreign
            try:
                manifest, installed = install_cache(
                    _Deadline(opened, deadline),
                    root,
                    kind,
                    scope,
                    accept=lambda m: self.refusal(m.verdict, local, foreign),
                    max_bytes=self.compile.max_bytes,
                )
            finally:
                opened.close()
        except Exception as exc:  # refused, corrupt, store errors: the node builds it
            untrusted = "refused: untrusted" in str(exc)
            if untrusted and opened is not None and opened.foreign is not None:
                warn_foreign(f"{layer.url}/{name}", opened.foreign)  # once per place
            else:
                log.warning(
                    "plancache: %s from %s not installed: %s: %s",
                    name,
                    label,
                    type(exc).__name__,
                    exc,
                )
            if result.reason == "miss":
                result.reason = "untrusted" if untrusted else "invalid"
            return
        result.reason = "hit"
        result.bundles += 1
        result.installed += installed
        result.known.update(e.path for e in manifest.files)

    def upload_cache(
        self,
        kind: str,
        scope: str,
        root: Path,
        known: frozenset[str],
        producer: dict[str, object] | None = None,
    ) -> tuple[int, dict[str, bool]]:
        """Store the files below ``root`` that ``known`` does not list (what this node added
        to cache ``kind`` in ``scope``: a delta, not a second copy) as one bundle,
        create-if-absent, on the store (unless it refuses writes: logged), then on the local
        tier. Returns how many files it held (0: nothing new, nothing written) and
        {destination: created}. Raises ``ArtifactError`` (a file changed while read)."""
        files = scan_cache(root, known, max_bytes=self.compile.max_bytes)
        out: dict[str, bool] = {}
        for label, layer in self._destinations() if files else ():

            def packed() -> tuple[Manifest, Iterator[bytes]]:
                return pack_cache(root, kind, scope, files, keyring=self.keyring, producer=producer)

            name = packed()[0].name  # named by its content: another node may have added it
            try:
                out[label] = self._write_once(label, layer, name, packed)
            except PlanStoreError as exc:
                log.warning("plancache: %s cache: not written to the %s: %s", kind, label, exc)
        if files:
            _written(f"cache_{kind}", out)
        return len(files), out

    def stored_manifest(self, key: str, rank: str) -> Manifest | None:
        """The manifest of the artifact of (key, rank) the first source holds (its head
        only), or None. Never raises."""
        for label, layer, _ in self._sources():
            try:
                opened = layer.open_object(object_name(key, rank))
                if opened is None:
                    continue
                try:
                    return read_manifest(opened, max_bytes=self.compile.max_bytes)
                finally:
                    opened.close()
            except Exception as exc:
                log.info("plancache: compile artifact %s/%s in %s: %s", key[:12], rank, label, exc)
        return None

    def _remove_stale_uploads(self, name: str) -> None:
        """Remove the temp files that killed uploads of ``name`` left in local stores."""
        layers = [self.local, None if self.remote else self.store]
        for layer in filter(None, layers):
            for local in beneath(layer):
                if isinstance(local, LocalStore):
                    with contextlib.suppress(PlanStoreError):
                        local.remove_stale_temp_files(name=name)

    def _destinations(self) -> list[tuple[str, ObjectLayer]]:
        """Where uploads and retractions write: the store (its object layer refuses writes
        in read-only mode and where the conformance probe found no honest store), then the
        local tier."""
        out: list[tuple[str, ObjectLayer]] = [("store", self.store)]
        if self.local is not None:
            out.append(("local-tier", self.local))
        return out

    def upload(
        self,
        root: Path,
        key: str,
        rank: str,
        labels: dict[str, object] | None = None,
        producer: dict[str, object] | None = None,
    ) -> dict[str, bool]:
        """Store ``root``'s (vLLM's ``<key>`` directory) artifact for ``rank``: on the store
        (unless it refuses writes: read-only, or not found honest; logged), then on the local
        tier; create-if-absent. Returns {destination: created} (False: an artifact was there
        already). Raises ``ArtifactError``, or ``PlanStoreError`` from the local tier."""
        out: dict[str, bool] = {}
        size: list[int] = []
        for label, layer in self._destinations():

            def packed() -> tuple[Manifest, Iterator[bytes]]:
                made = pack(
                    root,
                    key,
                    rank,
                    keyring=self.keyring,
                    labels=labels,
                    producer=producer,
                    max_bytes=self.compile.max_bytes,
                )
                size[:] = [made[0].total_size]
                return made

            try:
                out[label] = self._write_once(label, layer, object_name(key, rank), packed)
            except PlanStoreReadOnlyError as exc:
                log.warning("plancache: compile artifacts: not written to the %s: %s", label, exc)
            except PlanStoreError as exc:
                if label == "local-tier":
                    raise
                log.warning("plancache: compile artifacts: not written to the %s: %s", label, exc)
        _written("compile_artifact", out)
        if out.get("store") and size:
            metrics.moved("compile_artifact", "uploaded", size[0])
        return out

    def _write_once(
        self,
        label: str,
        layer: ObjectLayer,
        name: str,
        packed: Callable[[], tuple[Manifest, Iterator[bytes]]],
    ) -> bool:
        """Write object ``name`` (``packed()``: its manifest and stream) create-if-absent,
        looking first: False, with nothing streamed, where it is stored already or (on the
        store) another node holds the claim to upload it (see ``claim``); under the claim it
        looks again (the last holder may have finished between the two)."""
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
            with contextlib.suppress(Exception):  # expires on its own
                layer.delete_object(name + CLAIM_SUFFIX, held)

    def retract(self, key: str, rank: str, digest: str) -> list[str]:
        """Delete the stored artifact of (key, rank) where it is the one whose manifest has
        ``digest``, and only the version judged (a read-only node deletes from its local
        tier only); the labels of the stores it was deleted from."""
        name = object_name(key, rank)
        gone = []
        for label, layer in reversed(self._destinations()):
            try:
                opened = layer.open_object(name)
                if opened is None:
                    continue
                try:
                    stored = read_manifest(opened, max_bytes=self.compile.max_bytes)
                finally:
                    opened.close()
                if stored.digest == digest and layer.delete_object(name, opened.version):
                    gone.append(label)
            except Exception as exc:
                log.warning(
                    "plancache: compile artifact %s not retracted from %s: %s", name, label, exc
                )
        return gone

    def close(self) -> None:
        self.store.close()


class Uploads:
    """Background uploads of one process: jobs on daemon threads (``plancache._background``),
    waited for at exit at most ``exit_wait`` seconds in all (``wait``); past it they are
    abandoned (an abandoned upload stores nothing: see ``plancache._objects``)."""

    def __init__(self) -> None:
        self.jobs: list[Job[object]] = []
        self.lock = threading.Lock()

    def start(self, target: Callable[..., object], *args: object) -> Job[object]:
        job = background.start(functools.partial(target, *args), "plancache-compile-upload")
        with self.lock:
            self.jobs.append(job)
        return job

    def running(self) -> list[Job[object]]:
        """The uploads not done yet."""
        with self.lock:
            return [job for job in self.jobs if not job.done()]

    def wait(self, timeout: float) -> bool:
        """Join every upload, ``timeout`` seconds in all; True if none is left running."""
        deadline = time.monotonic() + timeout
        with self.lock:
            jobs = list(self.jobs)
        return all([job.join(deadline - time.monotonic()) for job in jobs])
