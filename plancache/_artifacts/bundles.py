"""The cache bundles kind: what nodes added to a generated cache (Triton's, Inductor's,
FlashInfer's autotune files, any program's), loaded as code. One module serves every cache:
a bundle is parameterised by its cache's kind name and scope.

- name: ``cache_<kind>_<scope>_<content>.tar`` (``manifest.cache_object_name``): the scope
  hashes the factors the cache's files are valid under, the content id the files alone, so
  nodes that add the same files name the same object;
- encoding: the signed manifest and tar stream of ``packing`` (``scan_cache``, ``pack_cache``);
  verified and installed by ``archive.install_cache``, file by file, create-if-absent;
- policy: a fetch installs every trusted, valid bundle of the kind and scope (at most
  ``MAX_BUNDLES`` a source, within the fetch bound); an upload stores what the node added
  (a delta on what the bundles read list, less what a trusted stored bundle holds: one the
  fetch did not read, added since, or past its bound) as one bundle, create-if-absent,
  under a claim: no upload repeats a file a trusted stored bundle holds (heads read within
  the fetch bound, at most ``MAX_BUNDLES``; what could not be read is taken as not held).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plancache._artifacts.archive import install_cache, read_manifest, remove_partial_installs
from plancache._artifacts.engine import CacheFetched, Engine, Source, count
from plancache._artifacts.kind import (
    Accept,
    Kind,
    Reader,
    Short,
    Table,
    manifest_head,
    manifest_show,
    signed_text,
    sized,
)
from plancache._artifacts.manifest import (
    CACHE_PREFIX,
    FileEntry,
    Manifest,
    Readable,
    parse_cache_name,
)
from plancache._artifacts.pacing import _Deadline
from plancache._artifacts.packing import pack_cache, scan_cache
from plancache._command.display import age, size
from plancache._keys import fingerprint
from plancache._objects import ObjectLayer, Opened
from plancache._reasons import Reason
from plancache._signing import Keyring
from plancache.errors import ArtifactError, InvalidPlanError

log = logging.getLogger("plancache")

MAX_BUNDLES = 1024
"""Most bundles of one cache and scope a fetch reads from a source (the first in name
order), within the fetch bound: a scope gains a bundle per node that added files (a Triton
scope: every model served on one GPU), and every bundle not read is rebuilt and uploaded
again by the node. Past it, the node builds what they lack itself."""


class CacheBundles:
    """The kind's operations on ``engine``'s stores (see the module docstring)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def fetch_cache(
        self,
        kind: str,
        scope: str,
        root: Path,
        *,
        max_bundles: int = MAX_BUNDLES,
        cancelled: Callable[[], bool] = lambda: False,
        progress: Callable[[int, int], None] | None = None,
    ) -> CacheFetched:
        """Install below ``root`` the files of every trusted, valid bundle of cache ``kind``
        in ``scope`` (at most ``max_bundles`` a source; a bundle read from one source is not
        read again from the next: ``bundles`` counts each once), each file create-if-absent,
        within the fetch bound, installing nothing more once ``cancelled()`` (its caller stopped
        waiting); ``progress(done, listed)`` after each bundle read. The paths every bundle
        read lists (installed or not) are returned as ``known``: an upload leaves them out;
        a file the node had with other bytes is kept and named in ``differing``. Never
        raises."""
        start = time.monotonic()
        deadline = start + self.engine.compile.fetch_timeout
        with contextlib.suppress(OSError):
            remove_partial_installs(root)
        prefix = f"{CACHE_PREFIX}{kind}_{scope}_"
        done: set[str] = set()  # read from an earlier source (the local tier's copy)
        total = [0, 0]  # bundles listed, bundles read

        def listed(layer: ObjectLayer) -> list[str]:
            names = []
            for name in layer.list_objects(prefix):
                if parse_cache_name(name) is not None and name not in done:
                    names.append(name)
                if len(names) >= max_bundles or time.monotonic() > deadline:
                    break
            total[0] += len(names)
            return sorted(names)

        def install_from(source: Source, name: str, opened: Opened) -> _Installed:
            named_kind, named_scope, _ = parse_cache_name(name) or ("", "", "")
            placed: list[tuple[FileEntry, str]] = []
            try:
                manifest, _ = install_cache(
                    _Deadline(opened, deadline, cancelled),
                    root,
                    named_kind,
                    named_scope,
                    accept=lambda m: self.engine.refusal(m.verdict, source.local, opened.foreign),
                    max_bytes=self.engine.compile.max_bytes,
                    keyring=self.engine.keyring,
                    placed=lambda entry, outcome: placed.append((entry, outcome)),
                )
            finally:
                total[1] += 1
                if progress is not None:
                    progress(total[1], total[0])
            done.add(name)  # named by its content: another source's copy is the same
            return _Installed(manifest, placed)

        read = self.engine.read(
            f"{kind} cache",
            listed,
            install_from,
            every=True,
            deadline=deadline,
            cancelled=cancelled,
        )
        result = _fetched(read.reason, read.got, time.monotonic() - start)
        count(f"cache_{kind}", result.reason, result.seconds)
        return result

    def _held(self, prefix: str, paths: set[str]) -> set[str]:
        """Which of ``paths`` a trusted bundle on the store (name ``prefix...``) holds: the
        heads of at most ``MAX_BUNDLES``, within the fetch bound, until every path is found.
        Fail-open: what could not be read is taken as not held."""
        held: set[str] = set()
        deadline = time.monotonic() + self.engine.compile.fetch_timeout
        source = self.engine.sources()[-1]
        if not self.engine.may_download(source.local):
            return held
        try:
            names = itertools.islice(source.layer.list_objects(prefix), MAX_BUNDLES)
            for name in names:
                if held >= paths or time.monotonic() > deadline:
                    break
                opened = source.layer.open_object(name)
                if opened is None:
                    continue
                try:
                    head = read_manifest(
                        opened, max_bytes=self.engine.compile.max_bytes, keyring=self.engine.keyring
                    )
                except ArtifactError:  # unsigned, corrupt: holds nothing for this upload
                    continue
                finally:
                    opened.close()
                if self.engine.refusal(head.verdict, source.local, opened.foreign) is None:
                    held |= paths.intersection(e.path for e in head.files)
        except Exception as exc:  # the upload goes on: at worst it repeats a file
            log.info("plancache: stored bundles not all read before an upload: %s", exc)
        return held

    def delta(
        self, kind: str, scope: str, root: Path, known: frozenset[str]
    ) -> tuple[list[FileEntry], Skipped]:
        """What an upload of cache ``kind`` in ``scope`` from ``root`` would store: the files
        below ``root`` that ``known`` does not list, less those a trusted stored bundle holds
        (one the fetch did not read, added since, or past its bound); and what it leaves out
        for either reason."""
        skipped = Skipped()
        files = scan_cache(
            root, known, max_bytes=self.engine.compile.max_bytes, kind=kind, skipped=skipped.add
        )
        if files:  # what a stored bundle holds already (one the fetch did not read)
            held = self._held(f"{CACHE_PREFIX}{kind}_{scope}_", {f.path for f in files})
            for f in files:
                if f.path in held:
                    skipped.add(f.size)
            files = [f for f in files if f.path not in held]
        return files, skipped

    def store(
        self,
        kind: str,
        scope: str,
        root: Path,
        files: list[FileEntry],
        producer: dict[str, object] | None = None,
        progress: Callable[[int, int], None] | None = None,
        factors: Mapping[str, object] | None = None,
    ) -> dict[str, bool]:
        """Store ``files`` (``delta``'s) of ``root`` as one bundle, create-if-absent, on the
        store (unless it refuses writes: logged), then on the local tier; {destination:
        created}; ``progress(done, files)`` as each file is streamed; ``factors``: those
        ``scope`` hashes, shown by ``ls``. Raises ``ArtifactError`` (a file changed while
        read)."""

        def packed() -> tuple[Manifest, Iterator[bytes]]:
            return pack_cache(
                root,
                kind,
                scope,
                files,
                keyring=self.engine.keyring,
                producer=producer,
                progress=progress,
                factors=factors,
            )

        name = packed()[0].name  # named by its content: another node may have added it
        return self.engine.write(f"cache_{kind}", f"{kind} cache", name, packed)

    def upload_cache(
        self,
        kind: str,
        scope: str,
        root: Path,
        known: frozenset[str],
        producer: dict[str, object] | None = None,
        factors: Mapping[str, object] | None = None,
    ) -> tuple[int, dict[str, bool]]:
        """Store the files below ``root`` that ``known`` does not list (what this node added
        to cache ``kind`` in ``scope``: a delta, not a second copy) as one bundle
        (``delta``, then ``store``; ``factors`` as ``store`` takes them). Returns how many
        files it held (0: nothing new, nothing written) and {destination: created}. Raises
        ``ArtifactError`` (a file changed while read)."""
        files, _ = self.delta(kind, scope, root, known)
        if not files:
            return 0, {}
        return len(files), self.store(kind, scope, root, files, producer, factors=factors)


@dataclass
class Skipped:
    """Files an upload left out (a pull's bundles or a stored bundle hold them, or they were
    there before the pull), and their bytes."""

    files: int = 0
    bytes: int = 0

    def add(self, size: int) -> None:
        self.files += 1
        self.bytes += size


@dataclass(frozen=True)
class _Installed:
    """One bundle installed: its manifest and what became of each of its files
    (``install_cache``'s ``placed``)."""

    manifest: Manifest
    placed: list[tuple[FileEntry, str]]


def _fetched(reason: Reason, got: list[_Installed], seconds: float) -> CacheFetched:
    """The ``CacheFetched`` of the bundles ``got``, built once (a path two bundles hold
    counts once: as installed, else as differing where one of them differs)."""
    outcomes: dict[str, dict[str, int]] = {"installed": {}, "same": {}, "differing": {}}
    for one in got:
        for entry, outcome in one.placed:
            outcomes[outcome][entry.path] = entry.size
    installed, differing = outcomes["installed"], outcomes["differing"]
    same = {p: n for p, n in outcomes["same"].items() if p not in installed and p not in differing}
    return CacheFetched(
        reason,
        bundles=len(got),
        installed=len(installed),
        known=frozenset(e.path for one in got for e in one.manifest.files),
        seconds=seconds,
        installed_bytes=sum(installed.values()),
        skipped=len(same),
        skipped_bytes=sum(same.values()),
        differing=tuple(sorted(set(differing) - set(installed))),
    )


def _check(stream: Readable, name: str, accept: Accept, max_bytes: int) -> None:
    """Every byte of a bundle, installed into a temp directory that is removed; its files
    are those its name says."""
    parsed = parse_cache_name(name)
    assert parsed is not None
    with tempfile.TemporaryDirectory(prefix="plancache-verify-") as temp:
        manifest, _ = install_cache(
            stream, Path(temp), *parsed[:2], accept=accept, max_bytes=max_bytes
        )
    if manifest.name != name:
        raise ArtifactError("its files are not those its name says")


FIRST_FACTORS = ("torch", "triton", "device")
"""The factors ``ls`` names first, where a scope has them."""


def scope_factors(m: Manifest) -> dict[str, object] | None:
    """The factors a bundle's scope hashes, as its labels carry them; None where it carries
    none, or ones that do not hash to its scope (another producer's words are not taken)."""
    if not m.labels:
        return None
    try:
        if fingerprint({**m.labels, "cache": m.kind}) != m.key:
            return None
    except (InvalidPlanError, TypeError, ValueError):
        return None
    first = [k for k in FIRST_FACTORS if k in m.labels]
    return {k: m.labels[k] for k in [*first, *sorted(set(m.labels) - set(first))]}


def scope_words(m: Manifest) -> str:
    """A bundle's scope for people: ``torch 2.13.0, triton none, device none`` where its
    factors are known (``scope_factors``), else the first 12 digits of its hash."""
    factors = scope_factors(m)
    if factors is None:
        return m.key[:12]
    return ", ".join(f"{k} {v}" for k, v in factors.items())


def _row(m: Manifest, now: float, keyring: Keyring) -> list[str]:
    host = str(m.producer.get("host", "-"))
    return [
        *(m.name, m.kind, scope_words(m), size(m.total_size), str(len(m.files))),
        *(age(now - m.created_at), host, signed_text(m, keyring)),
    ]


def _stats(names: Sequence[str], read: Reader, keyring: Keyring) -> dict[str, Any]:
    heads = read(names)
    return {"cache_bundles": len(heads), "cache_bundle_bytes": sum(m.total_size for m in heads)}


CACHE_BUNDLES = Kind(
    "cache",
    "cache bundle",
    CACHE_PREFIX,
    named=lambda name: parse_cache_name(name) is not None,
    head=manifest_head,
    owns=lambda m, name: m.name == name,
    check=_check,
    stats=_stats,
    stats_text=sized("caches", "bundle", "cache_bundles", "cache_bundle_bytes"),
    table=Table(
        ("BUNDLE", "CACHE", "SCOPE", "SIZE", "FILES", "AGE", "HOST", "SIGNED"),
        _row,
        frozenset({3, 4, 5}),
    ),
    fields=lambda m: {
        "cache": m.kind,
        "scope": m.key,
        "factors": scope_factors(m),
        "bytes": m.total_size,
        "files": len(m.files),
        "producer": dict(m.producer),
    },
    short=Short(
        re.compile(rf"{CACHE_PREFIX}[a-z][a-z0-9_]{{0,31}}_[0-9a-f]{{64}}"),
        lambda ref, name: name.startswith(f"{ref.strip()}_"),
        "an object name, or cache_<kind>_<scope> for every bundle of a scope",
        many=True,
    ),
    group=lambda m: f"{m.kind}_{m.key}",
    show=manifest_show(
        lambda m: [
            f"kind         {m.kind} cache bundle (files of a generated cache)",
            f"scope        {m.key}",
            f"             {scope_words(m)}",
        ]
    ),
)
"""The kind as the inventory and the commands see it (``plancache._artifacts.kind``)."""
