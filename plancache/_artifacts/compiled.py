"""The compile artifacts kind: one rank's torch.compile AOT directory, loaded as code.

- name: ``compile_artifact_<key>_<rank>.tar`` (``manifest.artifact_object_name``): vLLM's
  key and the rank directory;
- encoding: the signed manifest and tar stream of ``packing``; verified and installed
  atomically by ``archive.install`` (the rank directory appears with all its kernels, or
  not at all);
- policy: fetched from the first source holding a trusted, valid one (the one trust rule,
  and never one a boot on this node died with: ``judge``), within the fetch bound and never
  slower than compiling (``pacing``); uploaded create-if-absent under a claim; retracted
  only as the version judged.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from plancache import _metrics as metrics
from plancache import _reader as reader
from plancache._artifacts.archive import install, read_manifest, remove_partial_installs
from plancache._artifacts.engine import Engine, Fetched, Source, count
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
    NAME_PREFIX,
    Manifest,
    Readable,
    artifact_object_name,
    parse_artifact_object_name,
)
from plancache._artifacts.pacing import _Deadline, _Pace
from plancache._artifacts.packing import pack
from plancache._artifacts.trust import Refusal, Refused
from plancache._command.display import age, size
from plancache._objects import Opened
from plancache._observation import Observation
from plancache._signing import Keyring
from plancache.errors import ArtifactError

log = logging.getLogger("plancache")

METRIC = "compile_artifact"
"""The kind's name in metrics."""
WHAT = "compile artifact"
"""The kind's name in log lines."""
MAX_COMPARED = 8
"""Stored artifacts a miss is compared with (``others``)."""
ARTIFACT_MARKS_DIR = "compile_marks"
"""The crash-loop breaker's marks for artifacts, in the node's local directory."""


def artifact_id(key: str, rank: str) -> str:
    """The 64-hex name of (key, rank) in the crash-loop breaker."""
    return hashlib.sha256(artifact_object_name(key, rank).encode()).hexdigest()


def as_observation(manifest: Manifest) -> Observation:
    """The breaker's handle on ``manifest`` (its marks name observations): the producer
    carries the object name and the manifest's digest, which covers every file."""
    return Observation(
        1, 1, manifest.created_at, {"artifact": manifest.name, "digest": manifest.digest}
    )


class CompileArtifacts:
    """The kind's operations on ``engine``'s stores (see the module docstring)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def judge(
        self, manifest: Manifest, local: bool, avoid: frozenset[str], foreign: str | None = None
    ) -> Refused | None:
        """None to install ``manifest`` (from a local source if ``local``; ``foreign``: why
        others could have written it there), else why not: the trust rule, and never an
        artifact whose digest ``avoid`` lists (a boot on this node died with it)."""
        if as_observation(manifest).digest in avoid:
            return Refused(Refusal.CRASHED_BEFORE)
        return self.engine.refusal(manifest.verdict, local, foreign)

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
        deadline = start + self.engine.compile.fetch_timeout if deadline is None else deadline
        name = artifact_object_name(key, rank)
        with contextlib.suppress(OSError):
            remove_partial_installs(target)
        self.engine.remove_stale_uploads(name)

        def install_from(source: Source, name: str, opened: Opened) -> Manifest | None:
            pace = _Pace(start)
            judge = functools.partial(
                self.judge, local=source.local, avoid=avoid, foreign=opened.foreign
            )

            def accept(manifest: Manifest) -> Refused | None:
                why = judge(manifest)
                if why is None and streaming is not None:
                    streaming.set()
                return why

            return install(
                _Deadline(opened, deadline, cancelled),
                target,
                key,
                rank,
                accept=pace.watching(accept),
                max_bytes=self.engine.compile.max_bytes,
                progress=pace.update,
                proceed=lambda: not cancelled(),
                keyring=self.engine.keyring,
            )

        read = self.engine.read(
            WHAT, lambda layer: [name], install_from, deadline=deadline, cancelled=cancelled
        )
        manifest = read.got[0] if read.got else None
        result = Fetched(read.reason, manifest, read.source, time.monotonic() - start)
        count(METRIC, result.reason, result.seconds, manifest)
        return result

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
        size: list[int] = []

        def packed() -> tuple[Manifest, Iterator[bytes]]:
            made = pack(
                root,
                key,
                rank,
                keyring=self.engine.keyring,
                labels=labels,
                producer=producer,
                max_bytes=self.engine.compile.max_bytes,
            )
            size[:] = [made[0].total_size]
            return made

        name = artifact_object_name(key, rank)
        out = self.engine.write(METRIC, "compile artifacts", name, packed, local_errors_raise=True)
        if out.get("store") and size:
            metrics.moved(METRIC, "uploaded", size[0])
        return out

    def stored_manifest(self, key: str, rank: str) -> Manifest | None:
        """The manifest of the artifact of (key, rank) the first source holds (its head
        only), or None. Never raises."""
        for source in self.engine.sources():
            try:
                opened = source.layer.open_object(artifact_object_name(key, rank))
                if opened is None:
                    continue
                try:
                    return read_manifest(opened, max_bytes=self.engine.compile.max_bytes)
                finally:
                    opened.close()
            except Exception as exc:
                log.info(
                    "plancache: compile artifact %s/%s in %s: %s", key[:12], rank, source.label, exc
                )
        return None

    def others(self, key: str, rank: str, limit: int = MAX_COMPARED) -> list[Manifest]:
        """The manifests (heads only) of at most ``limit`` artifacts of ``rank`` the store
        holds under keys other than ``key``, newest first: what a miss is compared with;
        where the keys require signatures, validly signed ones only (``reader``: one that
        cannot be read or judged is skipped). Never raises (a store that cannot be listed or
        read gives what was read)."""
        found: list[Manifest] = []
        source = self.engine.sources()[-1]  # the store: what the fleet shares
        mb, keyring = self.engine.compile.max_bytes, self.engine.keyring
        try:
            names = sorted(
                n
                for n in source.layer.list_objects(NAME_PREFIX)
                if (parsed := parse_artifact_object_name(n)) is not None
                and parsed[1] == rank
                and parsed[0] != key
            )
            for name in names[: 2 * limit]:  # bounded reads, in name order
                with contextlib.suppress(ArtifactError), reader.opened(source.layer, name) as o:
                    if o is not None:  # with keys, unsigned ones refused on their bytes
                        found.append(read_manifest(o, max_bytes=mb, keyring=keyring))
        except Exception as exc:
            log.info("plancache: compile artifacts of %s not listed: %s", rank, exc)
        found.sort(key=lambda m: -m.created_at)
        return found[:limit]

    def retract(self, key: str, rank: str, digest: str) -> list[str]:
        """Delete the stored artifact of (key, rank) where it is the one whose manifest has
        ``digest``, and only the version judged (a read-only node deletes from its local
        tier only); the labels of the stores it was deleted from."""
        name = artifact_object_name(key, rank)
        gone = []
        for label, layer in reversed(self.engine.destinations()):
            try:
                opened = layer.open_object(name)
                if opened is None:
                    continue
                try:
                    stored = read_manifest(opened, max_bytes=self.engine.compile.max_bytes)
                finally:
                    opened.close()
                if stored.digest == digest and layer.delete_object(name, opened.version):
                    gone.append(label)
            except Exception as exc:
                log.warning(
                    "plancache: compile artifact %s not retracted from %s: %s", name, label, exc
                )
        return gone


def _check(stream: Readable, name: str, accept: Accept, max_bytes: int) -> None:
    """Every byte of an artifact, extracted into a temp directory that is removed."""
    parsed = parse_artifact_object_name(name)
    assert parsed is not None
    with tempfile.TemporaryDirectory(prefix="plancache-verify-") as temp:
        install(stream, Path(temp) / parsed[0], *parsed, accept=accept, max_bytes=max_bytes)


def _row(m: Manifest, now: float, keyring: Keyring) -> list[str]:
    model, host = m.labels.get("model", "-"), m.producer.get("host", "-")
    return [
        *("compile", f"{m.key[:12]}/{m.rank}", str(model), size(m.total_size)),
        *(str(len(m.files)), age(now - m.created_at), str(host), signed_text(m, keyring)),
    ]


def _stats(names: Sequence[str], read: Reader, keyring: Keyring) -> dict[str, Any]:
    heads = read(names)
    stamps = [m.created_at for m in heads]
    return {
        "artifacts": len(heads),
        "artifact_bytes": sum(m.total_size for m in heads),
        "artifacts_oldest": min(stamps, default=None),
        "artifacts_newest": max(stamps, default=None),
    }


def _refers(ref: str, name: str) -> bool:
    """True if ``ref`` (``KEY/rank_R_D``, ``KEY`` a prefix of the key) names object ``name``."""
    prefix, _, rank = ref.strip().lower().partition("/")
    parsed = parse_artifact_object_name(name)
    return name == ref or (
        parsed is not None and parsed[0].startswith(prefix) and parsed[1] == rank
    )


COMPILE_ARTIFACTS = Kind(
    "compile",
    "compile artifact",
    NAME_PREFIX,
    named=lambda name: parse_artifact_object_name(name) is not None,
    head=manifest_head,
    owns=lambda m, name: (m.key, m.rank) == parse_artifact_object_name(name),
    check=_check,
    stats=_stats,
    stats_text=sized("compile", "artifact", "artifacts", "artifact_bytes"),
    table=Table(
        ("KIND", "ARTIFACT", "MODEL", "SIZE", "FILES", "AGE", "HOST", "SIGNED"),
        _row,
        frozenset({3, 4, 5}),
        signed_where_any=True,
    ),
    fields=lambda m: {
        "key": m.key,
        "rank": m.rank,
        "bytes": m.total_size,
        "files": len(m.files),
        "labels": dict(m.labels),
        "producer": dict(m.producer),
    },
    show=manifest_show(
        lambda m: [
            "kind         compile artifact (vLLM AOT)",
            f"key          {m.key}",
            f"rank         {m.rank}",
        ]
    ),
    short=Short(
        re.compile(r"[0-9a-fA-F]{1,64}/rank_[0-9]{1,6}_[0-9]{1,6}"), _refers, "KEY/rank_R_D"
    ),
    verified=", every byte",
)
"""The kind as the inventory and the commands see it (``plancache._artifacts.kind``)."""
