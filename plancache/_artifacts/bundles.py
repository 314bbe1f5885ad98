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
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from plancache._artifacts.archive import install_cache, read_manifest, remove_partial_installs
from plancache._artifacts.engine import CacheFetched, Engine, Source, count
from plancache._artifacts.manifest import CACHE_PREFIX, Manifest, parse_cache_name
from plancache._artifacts.pacing import _Deadline
from plancache._artifacts.packing import pack_cache, scan_cache
from plancache._objects import ObjectLayer, Opened
from plancache.errors import ArtifactError

log = logging.getLogger("plancache")

MAX_BUNDLES = 1024
"""Most bundles of one cache and scope a fetch reads from a source (the first in name
order), within the fetch bound: a scope gains a bundle per node that added files (a Triton
scope: every model served on one GPU), and every bundle not read is rebuilt and uploaded
again by the node. Past it, the node builds what they lack itself."""


class CacheBundles(Engine):
    """The kind on the engine's stores (see the module docstring)."""

    def fetch_cache(
        self,
        kind: str,
        scope: str,
        root: Path,
        *,
        max_bundles: int = MAX_BUNDLES,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> CacheFetched:
        """Install below ``root`` the files of every trusted, valid bundle of cache ``kind``
        in ``scope`` (at most ``max_bundles`` a source), each file create-if-absent, within
        the fetch bound, installing nothing more once ``cancelled()`` (its caller stopped
        waiting). The paths every bundle read lists (installed or not) are returned as
        ``known``: an upload leaves them out. Never raises."""
        start = time.monotonic()
        deadline = start + self.compile.fetch_timeout
        with contextlib.suppress(OSError):
            remove_partial_installs(root)
        prefix = f"{CACHE_PREFIX}{kind}_{scope}_"

        def listed(layer: ObjectLayer) -> list[str]:
            names = []
            for name in layer.list_objects(prefix):
                if parse_cache_name(name) is not None:
                    names.append(name)
                if len(names) >= max_bundles or time.monotonic() > deadline:
                    break
            return sorted(names)

        def install_from(source: Source, name: str, opened: Opened) -> tuple[Manifest, int]:
            named_kind, named_scope, _ = parse_cache_name(name) or ("", "", "")
            return install_cache(
                _Deadline(opened, deadline, cancelled),
                root,
                named_kind,
                named_scope,
                accept=lambda m: self.refusal(m.verdict, source.local, opened.foreign),
                max_bytes=self.compile.max_bytes,
                keyring=self.keyring,
            )

        read = self.read(
            f"{kind} cache",
            listed,
            install_from,
            every=True,
            deadline=deadline,
            cancelled=cancelled,
        )
        result = CacheFetched(read.reason)
        for manifest, installed in read.got:
            result.bundles += 1
            result.installed += installed
            result.known.update(e.path for e in manifest.files)
        result.seconds = time.monotonic() - start
        count(f"cache_{kind}", result.reason, result.seconds)
        return result

    def _held(self, prefix: str, paths: set[str]) -> set[str]:
        """Which of ``paths`` a trusted bundle on the store (name ``prefix...``) holds: the
        heads of at most ``MAX_BUNDLES``, within the fetch bound, until every path is found.
        Fail-open: what could not be read is taken as not held."""
        held: set[str] = set()
        deadline = time.monotonic() + self.compile.fetch_timeout
        source = self.sources()[-1]
        if not self.may_download(source.local):
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
                        opened, max_bytes=self.compile.max_bytes, keyring=self.keyring
                    )
                except ArtifactError:  # unsigned, corrupt: holds nothing for this upload
                    continue
                finally:
                    opened.close()
                if self.refusal(head.verdict, source.local, opened.foreign) is None:
                    held |= paths.intersection(e.path for e in head.files)
        except Exception as exc:  # the upload goes on: at worst it repeats a file
            log.info("plancache: stored bundles not all read before an upload: %s", exc)
        return held

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
        files = scan_cache(root, known, max_bytes=self.compile.max_bytes, kind=kind)
        if files:  # what a stored bundle holds already (one the fetch did not read)
            held = self._held(f"{CACHE_PREFIX}{kind}_{scope}_", {f.path for f in files})
            files = [f for f in files if f.path not in held]
        if not files:
            return 0, {}

        def packed() -> tuple[Manifest, Iterator[bytes]]:
            return pack_cache(root, kind, scope, files, keyring=self.keyring, producer=producer)

        name = packed()[0].name  # named by its content: another node may have added it
        return len(files), self.write(f"cache_{kind}", f"{kind} cache", name, packed)
