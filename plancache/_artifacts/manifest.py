"""The manifest of a compile artifact or of a cache bundle, its object name and its
signature (pure).

A manifest lists every file installed, each with its relative path, size, sha256 and mode
(0o644 or 0o755: no other bits are ever installed). Its canonical encoding without the
signature (``payload``: orjson, sorted keys) is what a key signs, so a valid signature covers
every byte installed. ``decode`` checks everything a reader relies on before any file is
written: paths (relative, no ``.``/``..``, a safe character set), the file-count and size
caps, and the digests' form. Two kinds of manifest:

- a compile artifact (``kind`` ``compile``): vLLM's ``key``, the ``rank`` directory
  ``rank_<r>_<dp>``; paths below ``inductor_cache/`` or the rank directory, ``<rank>/model``
  among them; object ``compile_artifact_<key>_<rank>.tar``;
- a cache bundle (``kind`` a name ``CACHE_KIND`` matches): files of a generated cache whose paths
  are named by their own keys (Triton's cache, what vLLM's warm-up adds to a compile
  artifact's ``inductor_cache/``, ...), valid where the factors hashed into ``key`` (the
  scope) hold; ``rank`` is empty; object ``cache_<kind>_<scope>_<content>.tar``, where the
  content id hashes the files alone, so nodes that add the same files name the same object.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

import orjson

from plancache._defaults import COMPILE_MAX_BYTES
from plancache._neighbours import MAX_DEPTH
from plancache._plan import Signature
from plancache._signing import NO_KEYS, Keyring, SignatureVerdict
from plancache.errors import ArtifactError, InvalidPlanError, UnreadableHereError

FORMAT = 1
MANIFEST_NAME = ".plancache/manifest.json"
"""The first member of every artifact's tar stream."""
MAX_MANIFEST_BYTES = 8 << 20
MAX_FILES = 20_000
"""Most files one artifact may hold (vLLM's tiny CPU model: 45)."""
MAX_PATH_CHARS = 1024
"""Longest relative path (a ustar header holds up to 255 characters; longer paths, or a
last component over 100, travel in a one-key extended header: ``packing``)."""
ENTRY_BYTES = 128
"""A manifest entry's bytes besides its path (JSON keys, size, digest, mode), rounded up."""
FILES_ROOM = MAX_MANIFEST_BYTES - (64 << 10)
"""Bytes of a manifest its entries may take (the rest: its other fields)."""
DEFAULT_MAX_BYTES: int = COMPILE_MAX_BYTES.default
"""Default cap on an artifact's total file size (``PLANCACHE_COMPILE_MAX_BYTES``)."""
INDUCTOR_DIR = "inductor_cache"
MODES = (0o644, 0o755)
NAME_PREFIX = "compile_artifact_"
NAME_SUFFIX = ".tar"
COMPILE = "compile"
CACHE_KINDS = ("inductor", "triton", "flashinfer_autotune")
"""The cache bundles' kinds the vLLM plugin shares (``plancache.integrations.vllm.caches``;
DeepGEMM's JIT cache is left out, docs/compile.md says why); any name ``CACHE_KIND`` matches
is a kind (``plancache.caches``)."""
CACHE_KIND = re.compile(r"[a-z][a-z0-9_]{0,31}")
"""A cache kind's name: lowercase letters, digits and ``_`` (not ``compile``)."""
CACHE_PREFIX = "cache_"

_KEY = re.compile(r"[0-9a-f]{64}")
_RANK = re.compile(r"rank_[0-9]{1,6}_[0-9]{1,6}")
_COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+=@,~-]{0,254}")
_SHA = re.compile(r"[0-9a-f]{64}")
_CONTENT = re.compile(r"[0-9a-f]{32}")
_CACHE_NAME = re.compile(
    rf"{CACHE_PREFIX}({CACHE_KIND.pattern})_([0-9a-f]{{64}})_([0-9a-f]{{32}}){NAME_SUFFIX}"
)


E = TypeVar("E", bound="Envelope")


class Readable(Protocol):
    def read(self, n: int, /) -> bytes: ...


class Envelope:
    """A signed JSON object (a manifest, a model info, a boot report; each a frozen
    dataclass with a ``signature`` field): ``body()`` is every field but the signature, its
    canonical encoding (``payload``: orjson, sorted keys) what a key signs."""

    signature: Signature | None

    def body(self) -> dict[str, Any]:
        raise NotImplementedError

    def payload(self) -> bytes:
        """The canonical bytes a signature covers (everything but the signature)."""
        return orjson.dumps(self.body(), option=orjson.OPT_SORT_KEYS)

    def encode(self) -> bytes:
        body = self.body()
        if self.signature is not None:
            body["signature"] = self.signature.to_dict()
        return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)

    def signed_with(self: E, keyring: Keyring) -> E:
        """Signed with ``keyring``'s signing key, or as it is when it holds none."""
        if not keyring.can_sign:
            return self
        return replace(self, signature=keyring.sign_payload(self.payload()))  # type: ignore[type-var]

    def verdict(self, keyring: Keyring) -> SignatureVerdict:
        return keyring.verdict_payload(self.payload(), self.signature)


def parse_signature(obj: dict[str, Any], what: str, error: type[Exception]) -> Signature | None:
    """The ``signature`` of a decoded envelope, None if it has none; ``error`` if malformed."""
    sig = obj.get("signature")
    try:
        return None if sig is None else Signature.from_dict(sig)
    except ValueError as exc:
        raise error(f"{what}'s signature is malformed: {exc}") from None


def read_bounded(stream: Readable, limit: int) -> bytes:
    """At most ``limit`` + 1 bytes of ``stream`` (more than ``limit``: too long to decode)."""
    chunks: list[bytes] = []
    got = 0
    while got <= limit and (chunk := stream.read(limit + 1 - got)):
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


class Unvouched(ArtifactError):
    """An envelope no accepted key signed, refused on its bytes before any structure was
    built from it (where the keys require signatures)."""


def decode_versioned(
    data: bytes,
    what: str,
    limit: int,
    version: int,
    *,
    error: type[Exception],
    keyring: Keyring = NO_KEYS,
) -> dict[str, Any]:
    """The JSON object ``data`` of format ``version``, ``what`` in messages: ``error`` for
    anything else (over ``limit`` bytes, not JSON, not an object, another format), but
    ``UnreadableHereError`` for a newer format (another plancache's: kept, not corrupt).
    Where ``keyring`` requires signatures, ``Unvouched`` unless an accepted key signed the
    canonical encoding of the object without its ``signature`` (what ``Envelope.payload``
    is for every genuine envelope): judged on the bytes, before the caller builds anything
    from them."""
    if len(data) > limit:
        raise error(f"{what} over {limit} bytes")
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise error(f"{what} is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise error(f"{what} is not a JSON object")
    if keyring.requires_signature:
        body = {k: v for k, v in obj.items() if k != "signature"}
        payload = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
        verdict = keyring.verdict_payload(payload, parse_signature(obj, what, error))
        if verdict is not SignatureVerdict.VALID:
            raise Unvouched(f"{what} refused: invalid:signature ({verdict})")
    form = obj.get("format")
    if isinstance(form, int) and not isinstance(form, bool) and form > version:
        raise UnreadableHereError(
            f"{what} of format {form}, newer than this plancache reads ({version})"
        )
    if form != version:
        raise error(f"not {what} of format {version}")
    return obj


def check_key(key: object) -> str:
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise InvalidPlanError("an artifact key is 64 lowercase hex digits")
    return key


def check_rank(rank: object) -> str:
    if not isinstance(rank, str) or not _RANK.fullmatch(rank):
        raise InvalidPlanError("an artifact rank is rank_<r>_<dp>")
    return rank


def artifact_object_name(key: str, rank: str) -> str:
    """``compile_artifact_<key>_<rank>.tar``; ``InvalidPlanError`` for a malformed part."""
    return f"{NAME_PREFIX}{check_key(key)}_{check_rank(rank)}{NAME_SUFFIX}"


def parse_artifact_object_name(name: str) -> tuple[str, str] | None:
    """(key, rank) of an artifact's object base name, or None for any other name."""
    if not (name.startswith(NAME_PREFIX) and name.endswith(NAME_SUFFIX)):
        return None
    middle = name[len(NAME_PREFIX) : -len(NAME_SUFFIX)]
    key, _, rank = middle.partition("_")
    if _KEY.fullmatch(key) and _RANK.fullmatch(rank):
        return key, rank
    return None


def is_cache_kind(kind: object) -> bool:
    """True if ``kind`` can name a cache kind (``CACHE_KIND``, not ``compile``)."""
    return isinstance(kind, str) and kind != COMPILE and CACHE_KIND.fullmatch(kind) is not None


def cache_object_name(kind: str, scope: str, content: str) -> str:
    """``cache_<kind>_<scope>_<content>.tar``; ``InvalidPlanError`` for a malformed part."""
    if not is_cache_kind(kind) or not _CONTENT.fullmatch(content):
        raise InvalidPlanError(f"not a cache bundle: {kind!r:.30}, {content!r:.40}")
    return f"{CACHE_PREFIX}{kind}_{check_key(scope)}_{content}{NAME_SUFFIX}"


def parse_cache_name(name: str) -> tuple[str, str, str] | None:
    """(kind, scope, content) of a cache bundle's object base name, or None."""
    found = _CACHE_NAME.fullmatch(name)
    if found is None or found[1] == COMPILE:
        return None
    return found[1], found[2], found[3]


def check_path(path: object, rank: str) -> str:
    """``path`` if it is a safe relative path below ``inductor_cache/`` or ``rank/`` (a
    compile artifact's), or anywhere below the cache's root (``rank`` empty: a bundle's)."""
    if not isinstance(path, str) or len(path) > MAX_PATH_CHARS:
        raise InvalidPlanError(
            f"artifact path {path!r:.60} is not a string of <= {MAX_PATH_CHARS} chars"
        )
    parts = path.split("/")
    if len(parts) > MAX_DEPTH + 1:
        raise InvalidPlanError(f"artifact path {path!r:.60} is over {MAX_DEPTH} directories deep")
    if rank and (len(parts) < 2 or parts[0] not in (INDUCTOR_DIR, rank)):
        raise InvalidPlanError(f"artifact path {path!r:.60} is outside {INDUCTOR_DIR}/ and {rank}/")
    for part in parts:
        if not _COMPONENT.fullmatch(part) or part in (".", ".."):
            raise InvalidPlanError(f"artifact path {path!r:.60} has an unsafe component")
    return path


def _file_and_directory(paths: list[str]) -> bool:
    """True if a path of ``paths`` is a directory of another: in component order, a path's
    descendants follow it directly (linear in the paths' total length, after the sort)."""
    ordered = sorted(p.split("/") for p in paths)
    return any(
        len(after) > len(before) and after[: len(before)] == before
        for before, after in itertools.pairwise(ordered)
    )


@dataclass(frozen=True)
class FileEntry:
    """One file: relative path, size in bytes, sha256 hex of its content, mode."""

    path: str
    size: int
    sha256: str
    mode: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256, "mode": self.mode}

    @classmethod
    def from_dict(cls, obj: object, rank: str) -> FileEntry:
        if not isinstance(obj, dict) or set(obj) != {"path", "size", "sha256", "mode"}:
            raise InvalidPlanError("a manifest entry has path, size, sha256 and mode only")
        size, sha, mode = obj["size"], obj["sha256"], obj["mode"]
        if type(size) is not int or size < 0:
            raise InvalidPlanError("a manifest entry's size is an int >= 0")
        if not isinstance(sha, str) or not _SHA.fullmatch(sha):
            raise InvalidPlanError("a manifest entry's sha256 is 64 lowercase hex digits")
        if type(mode) is not int or mode not in MODES:
            raise InvalidPlanError("a manifest entry's mode is 0o644 or 0o755")
        return cls(check_path(obj["path"], rank), size, sha, mode)


@dataclass(frozen=True)
class Manifest(Envelope):
    """What an artifact holds (see the module docstring)."""

    key: str
    rank: str
    files: tuple[FileEntry, ...]
    created_at: float = field(default_factory=time.time)
    producer: Mapping[str, Any] = field(default_factory=dict)
    labels: Mapping[str, Any] = field(default_factory=dict)
    signature: Signature | None = None
    kind: str = COMPILE
    """``compile`` (``key``: vLLM's, ``rank``) or a cache kind (``key``: the scope)."""

    @property
    def total_size(self) -> int:
        return sum(e.size for e in self.files)

    @property
    def content(self) -> str:
        """32 hex digits naming the files alone (paths, digests, modes)."""
        listed = sorted((e.path, e.sha256, e.mode) for e in self.files)
        return hashlib.sha256(orjson.dumps(listed)).hexdigest()[:32]

    @property
    def name(self) -> str:
        if self.kind == COMPILE:
            return artifact_object_name(self.key, self.rank)
        return cache_object_name(self.kind, self.key, self.content)

    def body(self) -> dict[str, Any]:
        body = {
            "format": FORMAT,
            "key": self.key,
            "rank": self.rank,
            "files": [e.to_dict() for e in self.files],
            "created_at": self.created_at,
            "producer": dict(self.producer),
            "labels": dict(self.labels),
        }
        if self.kind != COMPILE:  # a compile artifact's encoding is that of 0.3.0
            body["kind"] = self.kind
        return body

    @property
    def digest(self) -> str:
        """sha256 hex of ``payload``: names this artifact's content (every file's digest)."""
        return hashlib.sha256(self.payload()).hexdigest()

    @classmethod
    def decode(
        cls, data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES, keyring: Keyring = NO_KEYS
    ) -> Manifest:
        """Parse and check a manifest (see the module docstring); ``InvalidPlanError``.
        Work and memory grow with ``len(data)`` only: where ``keyring`` requires signatures
        an unsigned one is refused (``Unvouched``) before any entry is built; each path is
        checked (length, depth, characters) as its entry is built; no directory is listed
        for a path (a path that is also a directory is found among the sorted paths)."""
        obj = decode_versioned(
            data,
            "artifact manifest",
            MAX_MANIFEST_BYTES,
            FORMAT,
            error=InvalidPlanError,
            keyring=keyring,
        )
        kind = obj.get("kind", COMPILE)
        if kind != COMPILE and not is_cache_kind(kind):
            raise UnreadableHereError(f"a cache bundle of kind {kind!r:.40}, unknown here")
        rank = check_rank(obj.get("rank")) if kind == COMPILE else obj.get("rank")
        if rank != "" and kind != COMPILE:
            raise InvalidPlanError("a cache bundle's rank is empty")
        assert isinstance(rank, str)
        files = obj.get("files")
        if not isinstance(files, list) or len(files) > MAX_FILES:
            raise InvalidPlanError(f"an artifact lists at most {MAX_FILES} files")
        entries = tuple(FileEntry.from_dict(f, rank) for f in files)
        paths = [e.path for e in entries]
        if len(set(paths)) != len(paths):
            raise InvalidPlanError("an artifact lists a path twice")
        if _file_and_directory(paths):
            raise InvalidPlanError("an artifact lists a path that is also a directory")
        if kind == COMPILE and f"{rank}/model" not in paths:
            raise InvalidPlanError(f"an artifact holds {rank}/model")
        if not paths:
            raise InvalidPlanError("a cache bundle holds a file at least")
        created, producer, labels = obj.get("created_at"), obj.get("producer"), obj.get("labels")
        if not isinstance(created, (int, float)) or isinstance(created, bool):
            raise InvalidPlanError("an artifact's created_at is a number")
        if not isinstance(producer, dict) or not isinstance(labels, dict):
            raise InvalidPlanError("an artifact's producer and labels are objects")
        sig = obj.get("signature")
        manifest = cls(
            check_key(obj.get("key")),
            rank,
            entries,
            float(created),
            producer,
            labels,
            None if sig is None else Signature.from_dict(sig),
            kind,
        )
        if manifest.total_size > max_bytes:
            raise UnreadableHereError(
                f"artifact of {manifest.total_size} bytes, over {max_bytes} (this process's "
                "cap, PLANCACHE_COMPILE_MAX_BYTES)"
            )
        return manifest
