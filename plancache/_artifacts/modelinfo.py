"""The model-info kind: vLLM's ``VLLM_CACHE_ROOT/modelinfos/<module>-<class>.json``, shared.

Without that file, vLLM's model registry inspects the model class in a fresh Python
subprocess (``_LazyRegisteredModel.inspect_model_cls``: 11-13 s of a boot on this machine);
with it, it reads the file. The file carries a ``hash`` of the model module's source, which
vLLM checks before using it, so a copy from another node serves only where the source is
the same.

A kind on the object layer, like compile artifacts (and with their stores and trust rule:
``engine``, ``trust``): an encoding and a policy, nothing about a backend; trusted as fact.

- key: vLLM's own hash of the module's source, with the module, the class and vLLM's version
  (``model_info_object_name``); one object ``model_info_<sha256>.json`` each;
- encoding: an envelope (format, module, class, vLLM version, the file vLLM wrote, time,
  signature), at most ``MAX_BYTES``, checked on every decode (``ModelInfo.decode``);
- policy: fetched when vLLM finds no file (before it inspects the class), installed
  atomically and never over a file the node has; uploaded create-if-absent once vLLM wrote
  one; trusted as compile artifacts are (``trust.Trust.refusal``): signed with keys, else
  from a local directory no other user could write, or a remote store the operator trusts
  (``ModelInfoKind``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from plancache import _background as background
from plancache._artifacts.engine import Engine, Fetched, Source, count
from plancache._artifacts.kind import Reader, Table, envelope_kind, signed_text
from plancache._artifacts.manifest import (
    Envelope,
    Readable,
    decode_versioned,
    parse_signature,
    read_bounded,
)
from plancache._artifacts.pacing import TimedOut
from plancache._artifacts.trust import Refused
from plancache._command.display import age, when
from plancache._directory import Directory
from plancache._neighbours import read_file as read_neighbour
from plancache._neighbours import uploadable
from plancache._objects import Opened
from plancache._plan import Signature
from plancache._reasons import Reason
from plancache._signing import NO_KEYS, Keyring
from plancache.errors import ArtifactError, JobTimeout

log = logging.getLogger("plancache")

FORMAT = 1
NAME_PREFIX = "model_info_"
MAX_BYTES = 256 * 1024
"""Largest envelope read (vLLM's files are well under 1 KiB)."""


_NAME = re.compile(rf"{NAME_PREFIX}[0-9a-f]{{64}}\.json")


def is_model_info_object_name(name: str) -> bool:
    """True if ``name`` is a model-info object's name."""
    return bool(_NAME.fullmatch(name))


def model_info_object_name(vllm_version: str, module: str, cls: str, module_hash: str) -> str:
    """The object of a model-info file: vLLM's version, the class and its source's hash."""
    key = "\0".join((vllm_version, module, cls, module_hash)).encode()
    return f"{NAME_PREFIX}{hashlib.sha256(key).hexdigest()}.json"


@dataclass(frozen=True)
class ModelInfo(Envelope):
    """One shared model-info file and what it was made by."""

    vllm: str
    module: str
    cls: str
    file: dict[str, Any]
    """The JSON vLLM wrote (``{"hash": ..., "modelinfo": {...}}``)."""
    created_at: float
    signature: Signature | None = None

    @property
    def module_hash(self) -> str:
        return str(self.file["hash"])

    @property
    def name(self) -> str:
        return model_info_object_name(self.vllm, self.module, self.cls, self.module_hash)

    def body(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "vllm": self.vllm,
            "module": self.module,
            "class": self.cls,
            "file": self.file,
            "created_at": self.created_at,
        }

    @classmethod
    def decode(cls, data: bytes, keyring: Keyring = NO_KEYS) -> ModelInfo:
        """Parse and check an envelope; ``ArtifactError`` (``UnreadableHereError`` for a
        newer format; where ``keyring`` requires signatures, ``Unvouched`` for one no
        accepted key signed, judged on its bytes first)."""
        obj = decode_versioned(
            data, "model info", MAX_BYTES, FORMAT, error=ArtifactError, keyring=keyring
        )
        file, created = obj.get("file"), obj.get("created_at")
        texts = [obj.get(k) for k in ("vllm", "module", "class")]
        if not all(isinstance(t, str) and t for t in texts):
            raise ArtifactError(f"not a model info of format {FORMAT}")
        if not (
            isinstance(file, dict)
            and isinstance(file.get("hash"), str)
            and isinstance(file.get("modelinfo"), dict)
        ):
            raise ArtifactError("model info holds no vLLM model-info file")
        if not isinstance(created, (int, float)) or isinstance(created, bool):
            raise ArtifactError("model info's created_at is a number")
        signature = parse_signature(obj, "model info", ArtifactError)
        vllm, module, klass = (str(t) for t in texts)
        return cls(vllm, module, klass, file, float(created), signature)


def read(stream: Readable, keyring: Keyring = NO_KEYS) -> ModelInfo:
    """The envelope ``stream`` holds (at most ``MAX_BYTES`` + 1 bytes read), decoded:
    ``ArtifactError`` for anything else (see ``ModelInfo.decode``)."""
    return ModelInfo.decode(read_bounded(stream, MAX_BYTES), keyring)


def read_file(path: Path) -> dict[str, Any] | None:
    """The model-info file vLLM wrote at ``path`` (a regular file, at most ``MAX_BYTES``,
    read through ``plancache._neighbours``: no link followed, no FIFO waited on), or None
    if there is none, it is not one, or another user could have written it (the one
    foreign-writer rule, as an upload judges this node's files: ``uploadable``)."""
    try:
        read = read_neighbour(path.parent.parent, f"{path.parent.name}/{path.name}", MAX_BYTES)
    except OSError:
        return None
    if read is None or not uploadable(read.foreign):
        return None
    try:
        obj = orjson.loads(read.data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("hash"), str):
        return None
    return obj if isinstance(obj.get("modelinfo"), dict) else None


def install(info: ModelInfo, path: Path) -> bool:
    """Write ``info``'s file at ``path`` atomically (temp + ``link``), never over a file
    already there, through the guarded handle of vLLM's cache directory (``path``'s
    grandparent; its ``modelinfos`` directory never followed as a link); True if this
    call wrote it."""
    data = orjson.dumps(info.file, option=orjson.OPT_INDENT_2)
    with Directory.make(path.parent.parent, path.parent.name) as directory:
        return directory.write(path.name, data, 0o644, replace=False)


def made(vllm: str, module: str, cls: str, file: dict[str, Any], keyring: Keyring) -> ModelInfo:
    """The envelope of a file this node's vLLM wrote, signed where ``keyring`` can sign."""
    return ModelInfo(vllm, module, cls, file, time.time()).signed_with(keyring)


class ModelInfoKind:
    """The kind's operations on ``engine``'s stores (see the module docstring)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def fetch_model_info(
        self, name: str, module_hash: str, path: Path, *, timeout: float | None = None
    ) -> Fetched:
        """Install the model-info file ``name`` (of a module whose source has
        ``module_hash``) at ``path`` from the first source that holds a trusted, valid one,
        never over a file there. Returns within ``timeout`` seconds (default
        ``compile.fetch_timeout``) over any backend: past it, ``timeout``, and the fetch
        left running installs nothing. Never raises."""
        start = time.monotonic()
        bound = self.engine.compile.fetch_timeout if timeout is None else timeout

        def fetch(stop: threading.Event) -> Fetched:
            def install_from(source: Source, name: str, opened: Opened) -> ModelInfo | None:
                info = read(opened, self.engine.keyring)
                if info.name != name or info.module_hash != module_hash:
                    raise ArtifactError("model info of another module, class or source")
                why = self.engine.refusal(info.verdict, source.local, opened.foreign)
                if why is not None:
                    raise Refused(why.refusal, why.detail, "model info")
                if stop.is_set():
                    raise TimedOut("model info: its caller stopped waiting")
                return info if install(info, path) else None

            got = self.engine.read(
                "model info",
                lambda layer: [name],
                install_from,
                deadline=start + bound,
                cancelled=stop.is_set,
            )
            return Fetched(got.reason, source=got.source)

        try:
            result = background.within(fetch, bound, "plancache-modelinfo")
        except JobTimeout:
            log.warning("plancache: model info %s: not fetched within %g s: timeout", name, bound)
            result = Fetched(Reason.TIMEOUT)
        result = dataclasses.replace(result, seconds=time.monotonic() - start)
        count("model_info", result.reason, result.seconds)
        return result

    def upload_model_info(self, info: ModelInfo) -> dict[str, bool]:
        """Store ``info`` create-if-absent on the store (unless it refuses writes: logged),
        then on the local tier; {destination: created}. Never raises."""
        return self.engine.write_small("model_info", "model info", info.name, info.encode())


def _show(info: ModelInfo, where: str, keyring: Keyring) -> list[str]:
    return [
        "kind         model info (vLLM's modelinfos/ file)",
        f"class        {info.module}.{info.cls}",
        f"vllm         {info.vllm}",
        f"source hash  {info.module_hash}",
        f"object       {where}",
        f"created      {when(info.created_at, time.time())}",
        f"signed       {signed_text(info, keyring)}",
        *(f"modelinfo    {k}={v}" for k, v in sorted(info.file.get("modelinfo", {}).items())),
    ]


def _stats(names: Sequence[str], read: Reader, keyring: Keyring) -> dict[str, Any]:
    return {"model_infos": len(names)}  # counted, not read


MODEL_INFO = envelope_kind(
    "model-info",
    "model info",
    NAME_PREFIX,
    read,
    "its envelope names another module, class or source",
    named=is_model_info_object_name,
    stats=_stats,
    table=Table(
        ("KIND", "MODEL CLASS", "VLLM", "AGE", "SIGNED"),
        lambda info, now, keyring: [
            *("model-info", f"{info.module}.{info.cls}", info.vllm),
            *(age(now - info.created_at), signed_text(info, keyring)),
        ],
        frozenset({3}),
    ),
    fields=lambda i: {
        "module": i.module,
        "class": i.cls,
        "vllm": i.vllm,
        "source_hash": i.module_hash,
    },
    show=_show,
)
"""The kind as the inventory and the commands see it (``plancache._artifacts.kind``)."""
