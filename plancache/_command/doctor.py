"""``plancache doctor [URL]``: check a store and this node, one row per check.

Each check has a status: ``ok``; ``finding`` (something to fix: exit 1); ``info`` (only
absent or optional, e.g. no vLLM installed, no signing configured: never a finding). The
store checks: the client opens, reachability and latency (p50 of ``GETS`` reads of a missing
key), which credential source resolved (redacted), read and list permission, write and delete
permission and every step of the conformance probe (``plancache._probe``, whose verdict is
then cached for the write path), and the clock skew against the store's ``Date`` header.
The node checks: signing keys (ids only), the local directory and its ``marks`` and
``conformance`` subdirectories (path, owner, mode, free space), and vLLM (version, the
``plancache`` entry point, ``VLLM_PLUGINS``, ``PLANCACHE_COMPILE_CACHE``). Every network
call is bounded by the store's call timeouts; the whole command by ``--timeout``.

Which checks a store gets is what its layer declares (``ObjectLayer.probe_store``,
``endpoint``, ``credential_source``, ``call_timeout``), never its type: a backend registered
with ``register_backend`` that declares a probe store is checked as S3 and GCS are.
"""

from __future__ import annotations

import argparse
import dataclasses
import email.utils
import importlib.metadata
import os
import pwd
import secrets
import stat
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from plancache._artifacts.registry import KINDS
from plancache._backends.guarded import TRUST_VARIABLE
from plancache._backends.verdicts import VERDICTS_DIR, VerdictCache, identity, share
from plancache._breaker import MARKS_DIR
from plancache._command.display import echo, plural, print_json, print_table, size
from plancache._config import Settings, keyring_from_env
from plancache._defaults import CLOCK_WAIT_S, DOCTOR_SKEW_S, EXPLAIN_DIR, parse_storage_options
from plancache._directory import Directory
from plancache._forwarding import ForwardingLayer, beneath
from plancache._inventory.artifacts import names
from plancache._keys import plan_object_name
from plancache._objects import ObjectLayer
from plancache._probe import STEPS, StoreVerdict, probe
from plancache._redaction import scrub, secret_values, without_userinfo
from plancache._store import READ_LIMIT, PlanStore
from plancache._switches import kinds
from plancache.errors import ConfigError, PlanStoreError

Status = Literal["ok", "finding", "info"]
GETS = 5
"""Reads of a missing key timed for the latency figure."""
MIN_FREE_BYTES = 100 << 20
"""Free space of the local directory below which it is a finding."""


@dataclass(frozen=True)
class Check:
    """One row: what was checked, its status, and what was found."""

    section: str
    check: str
    status: Status
    detail: str


class _Doctor:
    def __init__(self, settings: Settings, secrets_: list[str]) -> None:
        self.settings = settings
        self.secrets = secrets_
        self.checks: list[Check] = []

    def add(self, section: str, check: str, status: Status, detail: str) -> None:
        self.checks.append(Check(section, check, status, scrub(detail, self.secrets)))

    def attempt(self, section: str, check: str, fn: Callable[[], str]) -> bool:
        """``fn()``'s text as an ``ok`` row, or its store error as a finding; True if ok."""
        try:
            self.add(section, check, "ok", fn())
        except PlanStoreError as exc:
            self.add(section, check, "finding", str(exc))
            return False
        return True

    # -- the store ----------------------------------------------------------------------------
    def store(self) -> None:
        settings = dataclasses.replace(self.settings, local_tier=None, read_only=False)
        stack = settings.open_store()  # the one open path: lazily, within its bound
        try:
            store = next(s for s in beneath(stack.layer) if not isinstance(s, ForwardingLayer))
        except PlanStoreError as exc:
            stack.close()
            self.add("store", "open", "finding", str(exc))
            return
        try:
            self.add("store", "open", "ok", f"{store.url} ({type(store).__name__})")
            target = store.probe_store()
            if target is not None:
                self.remote(store, target)
            else:
                self.local_store(store)
        finally:
            stack.close()

    def local_store(self, store: ObjectLayer) -> None:
        self.attempt("store", "list", lambda: held(store))
        why = "local directory: atomic by construction"
        if store.local_directory() is None:
            why = "the store declares no probe store: not probed"
        self.add("store", "conformance", "info", why)

    def remote(self, store: ObjectLayer, target: ObjectLayer) -> None:
        """The checks of a store that declares a probe store (``target``)."""
        endpoint: str | None = None

        def named() -> str:
            nonlocal endpoint
            endpoint = store.endpoint()
            return "none declared" if endpoint is None else without_userinfo(endpoint)

        if not self.attempt("store", "endpoint", named):
            return
        # not scrubbed again: gcsfs's method "anon" is also the ``token`` option's value
        source = credential_source(store, self.secrets)
        self.checks.append(Check("store", "credentials", "info", source))
        missing = secrets.token_hex(32)
        times: list[float] = []

        def reads() -> str:
            for _ in range(GETS):
                start = time.perf_counter()
                store.read_object(plan_object_name(missing), READ_LIMIT)
                times.append(time.perf_counter() - start)
            return f"p50 {statistics.median(times) * 1000:.1f} ms of {GETS} reads"

        if not self.attempt("store", "read", reads):
            return
        self.attempt(
            "store", "list", lambda: "ok" if next(store.list_objects(""), None) else "ok (empty)"
        )
        self.conformance(store, target)
        if endpoint is not None:
            self.clock(endpoint, store.call_timeout)

    def conformance(self, store: ObjectLayer, target: ObjectLayer) -> None:
        if self.settings.trust_preconditions:
            self.add("store", TRUST_VARIABLE, "info", "set: writes skip the probe's verdict")
        result = probe(target)
        ran = {s.name: s for s in result.steps}
        create, cleanup = ran.get("create"), ran.get("cleanup")
        write: Status = "ok" if create is not None and create.ok else "finding"
        if result.verdict is StoreVerdict.READ_ONLY:
            write = "info" if self.settings.read_only else "finding"
        self.add("store", "write", write, "ok" if write == "ok" else result.detail)
        if cleanup is not None and cleanup.ok is not None:
            self.add("store", "delete", "ok" if cleanup.ok else "finding", cleanup.detail or "ok")
        status: Status = "ok" if result.verdict is StoreVerdict.HONEST else "finding"
        if result.verdict is StoreVerdict.READ_ONLY:
            status = "info" if self.settings.read_only else "finding"
        for name, what in STEPS.items():
            step = ran.get(name)
            if name == "cleanup":  # shown as the delete permission
                continue
            if step is None:
                self.add("probe", name, "info", f"not run: {what}")
            else:  # a step that decided nothing (denied, no answer) is as the verdict
                done: Status = status if step.ok is None else "ok" if step.ok else "finding"
                self.add("probe", name, done, step.detail or what)
        self.add(
            "probe",
            "verdict",
            status,
            f"{result.verdict.value}: {result.detail} ({result.requests} calls, "
            f"{result.seconds:.2f} s)",
        )
        if result.verdict in (StoreVerdict.HONEST, StoreVerdict.LIES):
            cache = VerdictCache(Path(self.settings.local_dir) / VERDICTS_DIR)
            cache.save(identity(store), store.url, result)
            share(
                store, self.settings.keyring, result, replace_unreadable=True
            )  # what the fleet's nodes read first

    def clock(self, endpoint: str, bound: float | None) -> None:
        """The skew of this node's clock from the ``Date`` of ``endpoint``'s answer to one
        ``HEAD``, bounded by the store's call bound (else ``CLOCK_WAIT_S``)."""
        request = urllib.request.Request(endpoint, method="HEAD")
        wait = CLOCK_WAIT_S if bound is None else bound
        try:
            with urllib.request.urlopen(request, timeout=wait) as r:
                date = r.headers.get("Date")
        except urllib.error.HTTPError as exc:  # an error answer still carries a Date
            date = exc.headers.get("Date")
        except (OSError, ValueError) as exc:  # ValueError: not an http(s) URL
            self.add("store", "clock", "finding", f"no answer: {type(exc).__name__}")
            return
        now = time.time()
        if not date:
            self.add("store", "clock", "info", "the endpoint sends no Date header")
            return
        skew = now - email.utils.parsedate_to_datetime(date).timestamp()
        status: Status = "ok" if abs(skew) <= DOCTOR_SKEW_S else "finding"
        self.add("store", "clock", status, f"this node is {skew:+.0f} s from the store's Date")

    # -- this node ----------------------------------------------------------------------------
    def signing(self) -> None:
        try:
            keyring = keyring_from_env()
        except ConfigError as exc:
            self.add("node", "signing", "finding", str(exc))
            return
        if not keyring.requires_signature:
            self.add("node", "signing", "info", "not configured: records are not signed")
            return
        signs = keyring.signing_key_id or "none (verifies only)"
        accepted = ", ".join(keyring.key_ids)
        self.add("node", "signing", "ok", f"signing key id {signs}; accepted key ids {accepted}")

    def directories(self) -> None:
        root = Path(self.settings.local_dir)
        for name, path in (
            ("local dir", ""),
            ("marks dir", MARKS_DIR),
            ("verdicts dir", VERDICTS_DIR),
        ):
            self.add("node", name, *directory(root, path))
        self.misses(root)

    def misses(self, root: Path) -> None:
        """The plan lookups of this node that missed (the factors the vLLM plugin kept) and
        the command that names, for the newest, the factors that differ from stored plans.
        The directory is read through the guarded handle: a link planted as ``explain`` is
        not followed, and only its regular files are counted."""
        where = root / EXPLAIN_DIR
        kept: list[tuple[float, str]] = []
        try:
            explain = Directory.open(root, EXPLAIN_DIR)
            if explain is not None:
                with explain:
                    for name in explain.names():
                        st = explain.lstat(name) if name.endswith(".json") else None
                        if st is not None and stat.S_ISREG(st.st_mode):
                            kept.append((st.st_mtime, name))
        except OSError:
            kept = []
        if not kept:
            self.add("node", "misses", "info", "none kept (the plugin keeps a miss's factors)")
            return
        newest = where / max(kept)[1]
        store = without_userinfo(self.settings.url)
        self.add(
            "node",
            "misses",
            "info",
            f"{plural(len(kept), 'missed lookup')} kept in {where}; why the newest missed: "
            f"plancache explain {store} --factors {newest}",
        )

    def vllm(self) -> None:
        try:
            version = importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            self.add("vllm", "version", "info", "vLLM is not installed")
        else:
            self.add("vllm", "version", "ok", version)
        points = importlib.metadata.entry_points(group="vllm.general_plugins")
        ours = [p for p in points if p.name == "plancache"]
        status: Status = "ok" if ours else "finding"
        detail = ours[0].value if ours else "no 'plancache' entry point in vllm.general_plugins"
        self.add("vllm", "entry point", status, detail)
        plugins = os.environ.get("VLLM_PLUGINS")
        if plugins is None:
            self.add("vllm", "VLLM_PLUGINS", "ok", "unset: every plugin loads")
        elif "plancache" in [p.strip() for p in plugins.split(",")]:
            self.add("vllm", "VLLM_PLUGINS", "ok", f"{plugins!r} loads plancache")
        else:
            self.add("vllm", "VLLM_PLUGINS", "finding", f"{plugins!r} filters plancache out")
        for kind, on, why in kinds():
            self.add("vllm", kind, "ok" if on else "info", why)
        if self.settings.read_only:
            self.add(
                "vllm", "writes", "info", "off: PLANCACHE_READ_ONLY=1 (every kind is read only)"
            )


def held(store: ObjectLayer) -> str:
    """What ``store`` holds, every kind counted: ``2 plans, 1 cache bundle`` (kinds it holds
    none of left out), or ``nothing stored``."""
    counts = [(sum(1 for _ in PlanStore(store).iter_fingerprints()), "plan")]
    counts += [(len(names(store, kind)), kind.label) for kind in KINDS]
    return ", ".join(plural(n, label) for n, label in counts if n) or "nothing stored"


def credential_source(store: ObjectLayer, secrets_: list[str]) -> str:
    """Where the store's credentials came from (``ObjectLayer.credential_source``), never a
    secret (``secrets_`` are masked in an error)."""
    try:
        return store.credential_source() or "not declared by the store"
    except PlanStoreError as exc:
        return scrub(f"not resolved: {exc}", secrets_)


def directory(root: Path, relative: str = "") -> tuple[Status, str]:
    """(status, detail) of a directory plancache writes (``relative`` below the local
    directory ``root``, opened through the guarded handle: a link there is a finding, never
    followed): owner, mode, free space."""
    path = root / relative if relative else root
    try:
        handle = Directory.open(root, relative)
        if handle is None and os.path.lexists(path):
            return "finding", f"{path}: not a directory"
        if handle is None:
            return "info", f"{path}: not created yet"
        with handle:
            st, fs = os.fstat(handle.fd), os.fstatvfs(handle.fd)
    except OSError as exc:
        return "finding", f"{path}: {exc.strerror}"
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    free = fs.f_bavail * fs.f_frsize
    detail = f"{path}: owner {owner}, mode {stat.filemode(st.st_mode)}, {size(free)} free"
    problems = []
    if not os.access(path, os.W_OK | os.X_OK):
        problems.append("not writable by this user")
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        problems.append("writable by everyone")
    if free < MIN_FREE_BYTES:
        problems.append("low on space")
    return ("finding", f"{detail}: {', '.join(problems)}") if problems else ("ok", detail)


def cmd_doctor(args: argparse.Namespace) -> int:
    """Check the store ``args.url`` (default: ``PLANCACHE_URL``) and this node; print a table
    (or ``--json``); 0 if nothing was found, 1 if something was."""
    settings = Settings.from_env()
    options = settings.storage_options
    if args.storage_options is not None:
        options = parse_storage_options(args.storage_options, "--storage-options")
    settings = dataclasses.replace(settings, url=args.url or settings.url, storage_options=options)
    doctor = _Doctor(settings, list(secret_values({"url": settings.url, **options})))
    doctor.store()
    doctor.signing()
    doctor.directories()
    doctor.vllm()
    findings = sum(c.status == "finding" for c in doctor.checks)
    if args.json:
        checks = [asdict(c) for c in doctor.checks]
        print_json({"url": without_userinfo(settings.url), "findings": findings, "checks": checks})
        return 1 if findings else 0
    rows = [[c.section, c.check, c.status.upper(), c.detail] for c in doctor.checks]
    print_table(["SECTION", "CHECK", "STATUS", "DETAIL"], rows, right=set())
    echo(plural(findings, "finding"))
    return 1 if findings else 0
