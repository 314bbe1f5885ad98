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
the local tier are installed (trusted as vLLM's own cache directory is), and artifacts from a
remote store only with ``PLANCACHE_COMPILE_TRUST_UNSIGNED=1``, and never unsigned from a
store the conformance probe found to ignore write preconditions (``plancache.probe``).

Lying stores: a remote object store is written (uploads, retractions) only when the
conformance probe found it honest, as plans are (``backends.guarded``), unless
``PLANCACHE_TRUST_PRECONDITIONS=1``; the probe runs on the upload's background thread, never
on a fetch's path, which reads only a verdict already known.

Stores: the local tier first (when one is configured), then the store ``PLANCACHE_URL``
names. An upload writes the remote store (never in read-only mode), then the local tier,
each create-if-absent: the first artifact stored for a key serves everyone.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from plancache import background
from plancache.artifacts.archive import ArtifactError, Readable, install, pack, read_manifest
from plancache.artifacts.blobs import Blobs, LocalBlobs, blobs_for
from plancache.artifacts.manifest import DEFAULT_MAX_BYTES, Manifest, object_name
from plancache.backends.guarded import GuardedStore, open_guarded
from plancache.background import Job
from plancache.config import Settings, is_remote
from plancache.errors import ConfigError, PlanStoreError
from plancache.observation import Observation
from plancache.parse import parse_bool, parse_timeout
from plancache.probe import Verdict as StoreVerdict
from plancache.signing import Verdict

log = logging.getLogger("plancache")

DEFAULT_FETCH_S = 60.0
DEFAULT_EXIT_WAIT_S = 30.0
MARKS_DIR = "compile_marks"
"""The crash-loop breaker's marks for artifacts, in the node's local directory."""


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
        from plancache.integrations.vllm.enable import compile_on

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
    (``hit``, ``miss``, ``present``, ``untrusted``, ``invalid``, ``store-error``, ``timeout``)
    and the seconds it took."""

    reason: str
    manifest: Manifest | None = None
    source: str = ""
    seconds: float = 0.0


class _Deadline:
    """A reader that raises ``ArtifactError`` once ``deadline`` (monotonic) has passed."""

    def __init__(self, inner: Readable, deadline: float) -> None:
        self.inner, self.deadline = inner, deadline

    def read(self, n: int, /) -> bytes:
        if time.monotonic() > self.deadline:
            raise ArtifactError("fetch timed out")
        return self.inner.read(n)


class ArtifactStore:
    """The artifacts' side of the configured stores (see the module docstring)."""

    def __init__(self, settings: Settings, compile: CompileSettings) -> None:
        self.settings, self.compile = settings, compile
        self.keyring = settings.keyring
        self.local: Blobs | None = (
            LocalBlobs(settings.local_tier) if settings.local_tier is not None else None
        )
        self.remote = blobs_for(settings.url, dict(settings.storage_options))
        self.remote_is_remote = is_remote(settings.url)
        self._guard: GuardedStore | None = None
        self._guard_lock = threading.Lock()

    def guard(self) -> GuardedStore | None:
        """The conformance guard of the remote object store (opened on first use); None for
        a local store or other fsspec stores (not atomic anyway: see ``FsspecStore``)."""
        with self._guard_lock:
            if self._guard is None and self.remote_is_remote:
                s = self.settings
                store = open_guarded(
                    s.url, dict(s.storage_options), s.local_dir, trust=s.trust_preconditions
                )
                self._guard = store if isinstance(store, GuardedStore) else None
            return self._guard

    def check_writable(self) -> None:
        """Return if the remote store may be written; else raise ``PlanStoreError`` (it
        ignores write preconditions, its credentials may not write, or no verdict yet)."""
        guard = self.guard()
        if guard is not None:
            guard.check_writable()

    def lies(self) -> bool:
        """True if the remote store is already known to ignore write preconditions (no
        probe is run: a fetch's path never probes)."""
        try:
            guard = self.guard()
        except Exception:  # cannot open the client: the fetch reports the store error
            return False
        known = guard.known() if guard is not None and not guard.trust else None
        return known is not None and known.verdict is StoreVerdict.LIES

    def _sources(self) -> list[tuple[str, Blobs, bool]]:
        """(label, blobs, trusted without a signature), in reading order."""
        out = [("local-tier", self.local, True)] if self.local is not None else []
        out.append(("store", self.remote, not self.remote_is_remote))
        return out

    def judge(self, manifest: Manifest, trusted: bool, avoid: frozenset[str]) -> str | None:
        """None to install ``manifest``, else why not."""
        if as_observation(manifest).digest in avoid:
            return "gate:crashed-before (a boot on this node died with it)"
        if self.keyring.requires_signature:
            verdict = manifest.verdict(self.keyring)
            return None if verdict is Verdict.VALID else f"invalid:signature ({verdict})"
        if not (trusted or self.compile.trust_unsigned):
            return "untrusted: unsigned, from a remote store"
        if not trusted and self.lies():
            return "untrusted: unsigned, from a store that ignores write preconditions"
        return None

    def fetch(
        self, target: Path, key: str, rank: str, avoid: frozenset[str] = frozenset()
    ) -> Fetched:
        """Install the artifact of (key, rank) into ``target`` (vLLM's ``<key>`` directory)
        from the first source that holds a trusted, valid one. Never raises."""
        start = time.monotonic()
        deadline = start + self.compile.fetch_timeout
        name = object_name(key, rank)
        result = Fetched("miss")
        for label, blobs, trusted in self._sources():
            if not (trusted or self.compile.trust_unsigned or self.keyring.requires_signature):
                result = Fetched("untrusted", source=label)
                continue  # not even downloaded
            try:
                reader = blobs.open(name)
                if reader is None:
                    continue
                try:
                    manifest = install(
                        _Deadline(reader, deadline),
                        target,
                        key,
                        rank,
                        accept=lambda m, t=trusted: self.judge(m, t, avoid),  # type: ignore[misc]
                        max_bytes=self.compile.max_bytes,
                    )
                finally:
                    reader.close()
            except ArtifactError as exc:
                timed_out = time.monotonic() > deadline
                result = Fetched("timeout" if timed_out else "invalid", source=label)
                log.warning(
                    "plancache: compile artifact %s from %s not installed: %s", name, label, exc
                )
                if timed_out:
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
        return result

    def upload(
        self,
        root: Path,
        key: str,
        rank: str,
        labels: dict[str, object] | None = None,
        producer: dict[str, object] | None = None,
    ) -> dict[str, bool]:
        """Store ``root``'s (vLLM's ``<key>`` directory) artifact for ``rank``: on the remote
        store unless read-only, then on the local tier; create-if-absent. Returns
        {destination: created} (False: an artifact was there already). Raises
        ``ArtifactError`` or ``PlanStoreError``."""
        destinations: list[tuple[str, Blobs]] = []
        if not self.settings.read_only and self._may_write():
            destinations.append(("store", self.remote))
        if self.local is not None:
            destinations.append(("local-tier", self.local))
        out: dict[str, bool] = {}
        for label, blobs in destinations:
            manifest, chunks = pack(
                root,
                key,
                rank,
                keyring=self.keyring,
                labels=labels,
                producer=producer,
                max_bytes=self.compile.max_bytes,
            )
            out[label] = blobs.create(manifest.name, chunks)
        return out

    def retract(self, key: str, rank: str, digest: str) -> list[str]:
        """Delete the stored artifact of (key, rank) where it is the one whose manifest has
        ``digest`` (a read-only node deletes from its local tier only); the labels of the
        stores it was deleted from."""
        name = object_name(key, rank)
        gone = []
        targets = [("local-tier", self.local)] if self.local is not None else []
        if not self.settings.read_only and self._may_write():
            targets.append(("store", self.remote))
        for label, blobs in targets:
            assert blobs is not None
            try:
                reader = blobs.open(name)
                if reader is None:
                    continue
                try:
                    stored = read_manifest(reader, max_bytes=self.compile.max_bytes)
                finally:
                    reader.close()
                if stored.digest == digest and blobs.delete(name):
                    gone.append(label)
            except Exception as exc:
                log.warning(
                    "plancache: compile artifact %s not retracted from %s: %s", name, label, exc
                )
        return gone

    def _may_write(self) -> bool:
        """True if the remote store may be written now; else logs why not (once per call)."""
        try:
            self.check_writable()
        except PlanStoreError as exc:
            log.warning("plancache: compile artifacts: not written to the store: %s", exc)
            return False
        return True

    def close(self) -> None:
        for blobs in (self.local, self.remote):
            if blobs is not None:
                blobs.close()
        if self._guard is not None:
            self._guard.close()


class Uploads:
    """Background uploads of one process: jobs on daemon threads (``plancache.background``),
    waited for at exit at most ``exit_wait`` seconds in all (``wait``); past it they are
    abandoned (an abandoned upload stores nothing: see ``plancache.artifacts.blobs``)."""

    def __init__(self) -> None:
        self.jobs: list[Job[object]] = []
        self.lock = threading.Lock()

    def start(self, target: Callable[..., object], *args: object) -> Job[object]:
        job = background.start(functools.partial(target, *args), "plancache-compile-upload")
        with self.lock:
            self.jobs.append(job)
        return job

    def wait(self, timeout: float) -> bool:
        """Join every upload, ``timeout`` seconds in all; True if none is left running."""
        deadline = time.monotonic() + timeout
        with self.lock:
            jobs = list(self.jobs)
        return all([job.join(deadline - time.monotonic()) for job in jobs])
