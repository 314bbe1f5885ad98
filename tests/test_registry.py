"""Public scheme registration (``plancache.register_backend`` and the ``plancache.backends``
entry-point group) with a third-party backend defined here: an in-memory ``ObjectLayer``
(create-if-absent and if-version-matches under a lock) served as ``memtest://``. It passes
the store contract and the object-layer tests through the public registration, bare and
through ``Settings.open_store()``; plans and cache bundles work on it through ``from_env``;
entry points are read from a real ``*.dist-info`` on ``sys.path``; every misuse fails with
an error naming it."""

from __future__ import annotations

import functools
import io
import itertools
import logging
import threading
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

import plancache
from plancache import (
    CREATE,
    ConfigError,
    ObjectLayer,
    Opened,
    PlanCache,
    PlanStore,
    PlanStoreError,
    PlanStorePermissionError,
    PlanStoreUnavailableError,
    PutOutcome,
    Reason,
    Settings,
    UnknownSchemeError,
    UnsupportedStoreError,
    Update,
    open_store,
    register_backend,
)
from plancache._backends import open_layer
from plancache._backends.layer import CheckedLayer
from plancache._objects import WriteMode
from plancache.caches import CacheShare, directory_cache
from plancache.testing import FACTORS, GiB, StoreContract, make_plan, plan_object_name
from plancache.testing.contract import StoreFactory, StoreSpec, WriteRaw

# The object-layer tests of the built-in backends, collected here again: they run against
# this module's ``layer`` fixture (the third-party backend), unchanged.
from tests.test_object_layer import (  # noqa: F401
    test_a_conditional_delete_keeps_what_was_written_after_the_judging_read,
    test_a_write_whose_chunks_fail_leaves_no_object,
    test_create_only_if_absent_and_update_only_if_unchanged,
    test_listings_filter_by_prefix,
    test_names_that_name_no_object_are_refused,
)

KEY = "ab" * 32
"""A signing key (``openssl rand -hex 32``'s form)."""


# -- the third-party backend: ObjectLayer only, nothing of plancache's stores ----------------
class _Bucket:
    """One in-memory bucket: name -> (bytes, version), under a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.objects: dict[str, tuple[bytes, int]] = {}


_BUCKETS: dict[str, _Bucket] = {}
_BUCKETS_LOCK = threading.Lock()
_VERSIONS = itertools.count(1)
"""Version tokens, never reused (a deleted and recreated object gets a new one)."""


class MemLayer(ObjectLayer):
    """``memtest://<bucket>/<prefix>``: objects in this process's memory, shared by every
    ``MemLayer`` of the same URL. Create-if-absent and if-version-matches are checked and
    applied under the bucket's lock; a write reads all its chunks before taking it (a
    failing iterator stores nothing). ``fail``: raise that exception from every call."""

    def __init__(self, url: str, fail: BaseException | None = None, **options: Any) -> None:
        self._url = url.rstrip("/")
        self.options = options
        self.fail = fail
        self.closed = 0
        with _BUCKETS_LOCK:
            self.bucket = _BUCKETS.setdefault(self._url, _Bucket())

    @property
    def url(self) -> str:
        return self._url

    def _check(self) -> None:
        if self.fail is not None:
            raise self.fail

    def read_object(self, name: str, limit: int) -> tuple[bytes, object] | None:
        self._check()
        with self.bucket.lock:
            found = self.bucket.objects.get(name)
        return None if found is None else (found[0][:limit], found[1])

    def open_object(self, name: str) -> Opened | None:
        self._check()
        with self.bucket.lock:
            found = self.bucket.objects.get(name)
        return None if found is None else Opened(io.BytesIO(found[0]), found[1])

    def write_object(self, name: str, chunks: Iterable[bytes], mode: WriteMode = CREATE) -> bool:
        self._check()
        data = b"".join(chunks)
        with self.bucket.lock:
            current = self.bucket.objects.get(name)
            if isinstance(mode, Update):
                if current is None or current[1] != mode.version:
                    return False
            elif current is not None:
                return False
            self.bucket.objects[name] = (data, next(_VERSIONS))
            return True

    def delete_object(self, name: str, version: object | None = None) -> bool:
        self._check()
        with self.bucket.lock:
            current = self.bucket.objects.get(name)
            if current is None or (version is not None and current[1] != version):
                return False
            del self.bucket.objects[name]
            return True

    def list_objects(self, prefix: str) -> Iterator[str]:
        self._check()
        with self.bucket.lock:
            names = sorted(self.bucket.objects)
        return iter([n for n in names if n.startswith(prefix)])

    def close(self) -> None:
        self.closed += 1


def mem_factory(url: str, **options: Any) -> ObjectLayer:
    """A factory function (not a class) for the same backend."""
    return MemLayer(url, **options)


NOT_CALLABLE = 42
"""A ``module:attr`` target that names no callable."""

register_backend("memtest", MemLayer)


def _url(name: str = "memtest") -> str:
    return f"{name}://{uuid.uuid4().hex}/plans"


def _put_raw(url: str, name: str, data: bytes) -> None:
    """Store ``data`` as object ``name`` of ``url``'s bucket, past every check."""
    with _BUCKETS_LOCK:
        bucket = _BUCKETS.setdefault(url.rstrip("/"), _Bucket())
    with bucket.lock:
        bucket.objects[name] = (data, next(_VERSIONS))


def _objects(url: str) -> dict[str, bytes]:
    bucket = _BUCKETS.get(url.rstrip("/"))
    if bucket is None:
        return {}
    with bucket.lock:
        return {n: d for n, (d, _) in bucket.objects.items()}


# -- the contract, through the public registration --------------------------------------------
class TestRegisteredContract(StoreContract):
    """``open_store("memtest://...")``: the bare backend, wrapped."""

    supports_processes = False  # its objects live in this process

    @pytest.fixture
    def store_spec(self) -> StoreSpec:
        return _url(), {}

    @pytest.fixture
    def write_raw(self, store_spec: StoreSpec) -> WriteRaw:
        return lambda fp, data: _put_raw(store_spec[0], plan_object_name(fp), data)


def _settings_store(url: str) -> PlanStore:
    return Settings.from_env({"PLANCACHE_URL": url, "PLANCACHE_LOCAL_TIER": "0"}).open_store()


class TestRegisteredThroughSettingsContract(TestRegisteredContract):
    """The same backend through ``Settings.open_store()``: the stack a remote scheme gets
    (opened lazily, no local tier here)."""

    @pytest.fixture
    def store_factory(self, store_spec: StoreSpec) -> StoreFactory:
        return functools.partial(_settings_store, store_spec[0])


@pytest.fixture
def layer() -> Iterator[ObjectLayer]:
    """The object-layer tests' store (imported above), on the registered backend."""
    store = open_layer(_url())
    yield store
    store.close()


def test_open_store_wraps_the_layer_and_closes_it_once() -> None:
    store = open_store(_url(), some_option=1)
    assert isinstance(store, PlanStore) and store.atomic
    inner = _mem(store)
    assert isinstance(inner, MemLayer) and inner.options == {"some_option": 1}
    assert "memtest://" in repr(store) and "MemLayer" in repr(store)
    store.close()
    store.close()
    assert inner.closed == 1


def test_a_function_or_a_module_attr_path_registers_too() -> None:
    register_backend("memtest-fn", mem_factory)
    register_backend("memtest-str", "tests.test_registry:MemLayer")
    for scheme in ("memtest-fn", "memtest-str"):
        url = _url(scheme)
        store = open_store(url)
        plan = make_plan()
        assert store.put(plan) is PutOutcome.CREATED
        assert _objects(url) == {plan_object_name(plan.fingerprint): plan.encode()}


def test_schemes_are_case_insensitive() -> None:
    register_backend("MemTest-Case", MemLayer)
    assert isinstance(open_store("memtest-case://b/p"), PlanStore)
    assert isinstance(open_store("MEMTEST-CASE://b/p"), PlanStore)


# -- every kind, through the settings --------------------------------------------------------
def test_plans_round_trip_through_from_env(tmp_path: Path) -> None:
    url = _url()
    env = {"PLANCACHE_URL": url, "VLLM_CACHE_ROOT": str(tmp_path / "node1")}
    recorded = PlanCache.from_env(env).record(
        FACTORS, kv_cache_memory_bytes=10 * GiB, free_memory_baseline=70 * GiB
    )
    assert recorded.outcome is PutOutcome.CREATED, recorded
    fp = plancache.fingerprint(FACTORS)
    assert plan_object_name(fp) in _objects(url)  # the remote holds it
    assert (tmp_path / "node1" / "startup_plan" / plan_object_name(fp)).exists()  # the local tier
    other = {"PLANCACHE_URL": url, "VLLM_CACHE_ROOT": str(tmp_path / "node2")}
    decision = PlanCache.from_env(other).lookup(FACTORS, current_free_memory=75 * GiB)
    assert decision.reason is Reason.HIT and decision.kv_cache_memory_bytes == 10 * GiB
    miss = PlanCache.from_env(other).lookup({"model": "other"}, current_free_memory=75 * GiB)
    assert miss.reason is Reason.MISS


def test_a_registered_scheme_is_remote_read_only_honoured(tmp_path: Path) -> None:
    url = _url()
    env = {
        "PLANCACHE_URL": url,
        "VLLM_CACHE_ROOT": str(tmp_path / "node"),
        "PLANCACHE_READ_ONLY": "1",
    }
    settings = Settings.from_env(env)
    assert settings.local_tier == str(tmp_path / "node" / "startup_plan")
    recorded = PlanCache.from_settings(settings).record(
        FACTORS, kv_cache_memory_bytes=10 * GiB, free_memory_baseline=70 * GiB
    )
    assert recorded.outcome is PutOutcome.CREATED  # in the local tier only
    assert _objects(url) == {}


def test_cache_bundles_round_trip_through_from_env(tmp_path: Path) -> None:
    url = _url()
    producer_dir, consumer_dir = tmp_path / "producer", tmp_path / "consumer"
    (producer_dir / "k").mkdir(parents=True)
    (producer_dir / "k" / "kernel.bin").write_bytes(b"\x7fELF kernel")
    (producer_dir / "index.json").write_bytes(b'{"k": 1}')
    factors = {"compiler": "test 1.0", "device": "none"}
    base = {"PLANCACHE_URL": url, "PLANCACHE_SIGNING_KEY": KEY}
    with CacheShare.from_env({**base, "VLLM_CACHE_ROOT": str(tmp_path / "n1")}) as share:
        pushed = share.push(directory_cache("regtest", producer_dir, factors))
    assert pushed.files == 2 and any(pushed.written.values()), pushed
    assert any(name.startswith("cache_regtest_") for name in _objects(url))
    with CacheShare.from_env({**base, "VLLM_CACHE_ROOT": str(tmp_path / "n2")}) as share:
        pulled = share.pull(directory_cache("regtest", consumer_dir, factors))
    assert (consumer_dir / "k" / "kernel.bin").read_bytes() == b"\x7fELF kernel", pulled
    assert (consumer_dir / "index.json").read_bytes() == b'{"k": 1}'


# -- registration rules ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "scheme",
    ["", "1abc", "mem test", "memtest://", "mem_test", "a" * 33, None, 7],
    ids=["empty", "digit-first", "space", "with-separator", "underscore", "long", "none", "int"],
)
def test_a_malformed_scheme_is_refused(scheme: Any) -> None:
    with pytest.raises(ConfigError, match="not a URL scheme"):
        register_backend(scheme, MemLayer)


def test_the_separator_hint() -> None:
    with pytest.raises(ConfigError, match="without '://'"):
        register_backend("memtest://", MemLayer)


@pytest.mark.parametrize("factory", [42, None, "no colon", "a.b:", ":Cls", "mod:1x"])
def test_a_factory_neither_callable_nor_module_attr_is_refused(factory: Any) -> None:
    with pytest.raises(ConfigError, match=r"memtest-bad:// must be a callable or 'module:attr'"):
        register_backend("memtest-bad", factory)


def test_another_factory_for_a_taken_scheme_needs_clobber() -> None:
    register_backend("memtest-taken", MemLayer)
    register_backend("memtest-taken", MemLayer)  # the same again: nothing to do
    with pytest.raises(ConfigError, match=r"memtest-taken:// .*MemLayer.* clobber=True"):
        register_backend("memtest-taken", mem_factory)
    assert type(_mem(open_store(_url("memtest-taken")))) is MemLayer
    calls: list[str] = []

    def counting(url: str, **options: Any) -> ObjectLayer:
        calls.append(url)
        return MemLayer(url, **options)

    register_backend("memtest-taken", counting, clobber=True)
    url = _url("memtest-taken")
    open_store(url)
    assert calls == [url]


def test_a_built_in_scheme_is_replaced_only_with_clobber_and_restored() -> None:
    from plancache._backends.s3 import S3Store

    with pytest.raises(ConfigError, match=r"s3:// \(built-in\) is registered already"):
        register_backend("s3", MemLayer)
    register_backend("s3", "plancache._backends.s3:S3Store")  # the built-in's own: no change
    try:
        register_backend("s3", MemLayer, clobber=True)
        store = open_store("s3://regtest-bucket/plans")
        assert isinstance(_mem(store), MemLayer)
    finally:
        register_backend("s3", "plancache._backends.s3:S3Store", clobber=True)
    restored = open_layer("s3://regtest-bucket/plans", endpoint_url="http://127.0.0.1:9")
    try:
        assert isinstance(restored, S3Store)
    finally:
        restored.close()
    with pytest.raises(ConfigError, match="is registered already"):
        register_backend("s3", MemLayer)  # the built-in again, not a registration


def test_local_paths_are_not_replaceable() -> None:
    for clobber in (False, True):
        with pytest.raises(ConfigError, match=r"file:// .* not replaceable"):
            register_backend("file", MemLayer, clobber=clobber)


def test_a_registered_scheme_wins_over_fsspecs_protocol_of_that_name() -> None:
    import fsspec

    fsspec.register_implementation("memtest-fs", fsspec.get_filesystem_class("memory"))
    assert not isinstance(open_layer(f"memtest-fs://{uuid.uuid4().hex}"), plancache_layer())
    register_backend("memtest-fs", MemLayer)
    assert isinstance(open_layer(f"memtest-fs://{uuid.uuid4().hex}"), plancache_layer())


def plancache_layer() -> type[ObjectLayer]:
    return CheckedLayer


def _mem(store: PlanStore) -> ObjectLayer:
    """The third party's layer beneath ``store``'s checking layer."""
    checked = store.layer
    assert isinstance(checked, CheckedLayer), checked
    return checked.layer


def test_unknown_schemes_still_name_the_supported_ones() -> None:
    with pytest.raises(UnknownSchemeError, match=r"unknown store scheme 'nope-x'.*memtest://"):
        open_store("nope-x://bucket")


# -- what a bad backend gets -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("plancache_no_such_module:Layer", r"cannot be imported: No module named"),
        ("tests.test_registry:NoSuchLayer", r"tests.test_registry has no 'NoSuchLayer'"),
        ("tests.test_registry:NOT_CALLABLE", r"is a int, not a callable"),
    ],
    ids=["no-module", "no-attribute", "not-callable"],
)
def test_a_target_that_cannot_be_loaded_is_named(target: str, message: str) -> None:
    scheme = f"memtest-load-{uuid.uuid4().hex[:8]}"
    register_backend(scheme, target)  # costs no import: refused only when a URL needs it
    with pytest.raises(UnsupportedStoreError, match=message) as info:
        open_store(f"{scheme}://b/p")
    assert target in str(info.value) and f"{scheme}://" in str(info.value)


def test_a_factory_returning_no_object_layer_is_named() -> None:
    def wrong(url: str, **options: Any) -> Any:
        return {"url": url}

    register_backend("memtest-wrong", wrong, clobber=True)
    with pytest.raises(UnsupportedStoreError, match=r"wrong.* returned a dict, not a plancache"):
        open_store("memtest-wrong://b/p")


def test_a_factory_failing_carries_no_secret_out() -> None:
    def failing(url: str, **options: Any) -> ObjectLayer:
        raise RuntimeError(f"cannot log in with {options['secret']}")

    register_backend("memtest-fails", failing, clobber=True)
    with pytest.raises(RuntimeError, match="cannot log in") as info:
        open_store("memtest-fails://b/p", secret="hunter2-very-secret")
    assert "hunter2" not in str(info.value)


class _Liar(MemLayer):
    """Answers of the wrong types."""

    def read_object(self, name: str, limit: int) -> tuple[bytes, object] | None:
        return "text", 1  # type: ignore[return-value]

    def write_object(self, name: str, chunks: Iterable[bytes], mode: WriteMode = CREATE) -> bool:
        return None  # type: ignore[return-value]

    def list_objects(self, prefix: str) -> Iterator[str]:
        return iter([prefix + "ok", b"bytes"])  # type: ignore[list-item]


def test_wrong_answers_are_store_errors_naming_the_layer() -> None:
    register_backend("memtest-liar", _Liar, clobber=True)
    store = open_store("memtest-liar://b/p")
    with pytest.raises(
        PlanStoreError, match=r"_Liar.read_object gave tuple, expected None or \(bytes"
    ):
        store.get(make_plan().fingerprint)
    with pytest.raises(PlanStoreError, match=r"_Liar.write_object gave NoneType, expected a bool"):
        store.layer.write_object("x", [b"1"])
    with pytest.raises(PlanStoreError, match=r"_Liar.list_objects gave bytes"):
        list(store.layer.list_objects("startup_plan_"))


def test_reads_are_cut_to_the_limit() -> None:
    class Long(MemLayer):
        def read_object(self, name: str, limit: int) -> tuple[bytes, object] | None:
            return b"x" * (limit + 100), 1

    register_backend("memtest-long", Long, clobber=True)
    found = open_store("memtest-long://b/p").layer.read_object("a", 10)
    assert found == (b"x" * 10, 1)


def test_names_are_checked_before_the_layer_sees_them() -> None:
    seen: list[str] = []

    class Recording(MemLayer):
        def write_object(
            self, name: str, chunks: Iterable[bytes], mode: WriteMode = CREATE
        ) -> bool:
            seen.append(name)
            return super().write_object(name, chunks, mode)

    register_backend("memtest-names", Recording, clobber=True)
    store = open_store("memtest-names://b/p")
    for name in ("../x", "a/b", ""):
        with pytest.raises(ValueError, match="not an object name"):
            store.layer.write_object(name, [b"x"])
    assert seen == []


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (PermissionError(13, "denied for token s3cr3t-token-value"), PlanStorePermissionError),
        (ConnectionError("reset while sending s3cr3t-token-value"), PlanStoreUnavailableError),
        (TimeoutError("no answer"), PlanStoreUnavailableError),
        (OSError(5, "I/O error"), PlanStoreError),
    ],
    ids=["permission", "connection", "timeout", "other-os-error"],
)
def test_os_errors_become_store_errors_without_secrets(
    raised: OSError, expected: type[PlanStoreError]
) -> None:
    store = open_store(_url(), fail=raised, token="s3cr3t-token-value")
    with pytest.raises(expected) as info:
        store.get(make_plan().fingerprint)
    assert info.value.cause is raised
    assert "s3cr3t" not in str(info.value) and "s3cr3t" not in str(raised)
    assert "memtest://" in str(info.value) and "read" in str(info.value)


def test_a_failing_backend_is_a_miss_for_the_cache(tmp_path: Path) -> None:
    register_backend(
        "memtest-down", functools.partial(MemLayer, fail=ConnectionError("down")), clobber=True
    )
    env = {
        "PLANCACHE_URL": "memtest-down://b/p",
        "PLANCACHE_LOCAL_TIER": "0",
        "VLLM_CACHE_ROOT": str(tmp_path),
    }
    decision = PlanCache.from_env(env).lookup(FACTORS, current_free_memory=75 * GiB)
    assert decision.reason is Reason.STORE_ERROR and "down" in decision.detail


def test_other_exceptions_pass_unchanged() -> None:
    store = open_store(_url(), fail=KeyError("a bug in the layer"))
    with pytest.raises(KeyError, match="a bug in the layer"):
        store.get(make_plan().fingerprint)


# -- the entry-point group -------------------------------------------------------------------
ENTRY_POINTS = """\
[plancache.backends]
memtest-ep = tests.test_registry:MemLayer
memtest-ep-fn = tests.test_registry:mem_factory
memtest-ep-broken = plancache_no_such_module:Layer
memtest-ep-mine = tests.test_registry:mem_factory
s3 = tests.test_registry:MemLayer
bad_scheme = tests.test_registry:MemLayer
memtest-ep-novalue = tests.test_registry
"""


@pytest.fixture
def distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A distribution ``regtest-backends 1.0`` declaring ``plancache.backends`` entry
    points, installed as a ``*.dist-info`` directory on ``sys.path`` for this test."""
    site = tmp_path / "site"
    info = site / "regtest_backends-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: regtest-backends\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(site))
    return site


def test_entry_points_serve_their_schemes(
    distribution: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from plancache._backends.s3 import S3Store

    caplog.set_level(logging.WARNING, logger="plancache")
    register_backend("memtest-ep-mine", MemLayer)  # code in the process wins over the entry point
    for scheme in ("memtest-ep", "memtest-ep-fn"):
        url = _url(scheme)
        store = open_store(url)
        assert isinstance(_mem(store), MemLayer)
        assert store.put(make_plan()) is PutOutcome.CREATED
        assert isinstance(store.layer, CheckedLayer)
        assert "entry point of regtest-backends 1.0" in store.layer.origin
    mine = open_store(_url("memtest-ep-mine"))
    assert isinstance(mine.layer, CheckedLayer)
    assert "register_backend" in mine.layer.origin
    with pytest.raises(UnsupportedStoreError, match=r"memtest-ep-broken:// .*entry point of "):
        open_store("memtest-ep-broken://b/p")
    builtin = open_layer("s3://regtest-bucket/p", endpoint_url="http://127.0.0.1:9")
    try:
        assert isinstance(builtin, S3Store)  # a built-in is never replaced by an entry point
    finally:
        builtin.close()
    warned = "\n".join(r.getMessage() for r in caplog.records)
    assert "s3 = tests.test_registry:MemLayer skipped: s3:// is built in" in warned
    assert "bad_scheme" in warned and "memtest-ep-novalue" in warned
    with pytest.raises(UnknownSchemeError):
        open_store("memtest-ep-novalue://b/p")


def test_entry_points_work_through_from_env_in_a_fresh_process(distribution: Path) -> None:
    """The way the ``plancache`` command or a vLLM worker sees a scheme: a new interpreter,
    nothing registered in code, the entry point read on the first URL of its scheme."""
    import subprocess
    import sys

    from plancache.testing import child_env

    script = (
        "import sys; from plancache import PlanCache, fingerprint\n"
        "from plancache.testing import FACTORS, GiB\n"
        "url = sys.argv[1]\n"
        "env = {'PLANCACHE_URL': url, 'PLANCACHE_LOCAL_TIER': '0'}\n"
        "cache = PlanCache.from_env(env)\n"
        "r = cache.record(FACTORS, kv_cache_memory_bytes=10 * GiB, free_memory_baseline=70 * GiB)\n"
        "d = cache.lookup(FACTORS, current_free_memory=75 * GiB)\n"
        "print(r.reason.value, d.reason.value, d.kv_cache_memory_bytes == 10 * GiB)\n"
        "checked = cache.store.layer.inner\n"
        "print(type(checked).__name__, type(checked.layer).__name__)\n"
    )
    root = Path(__file__).resolve().parent.parent  # where ``tests`` imports from
    env = child_env([distribution, root])
    done = subprocess.run(
        [sys.executable, "-c", script, _url("memtest-ep")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["created", "hit", "True", "CheckedLayer", "MemLayer"]
