"""The object-store contract as a pytest base class: ``ObjectStoreContract`` is
``StoreContract`` (``plancache.testing.contract``) plus what an object store behind HTTP
promises: one request per read and per create, a fixed number per merge and per conditional
delete, objects that the service's standard tools read, other objects under the prefix
ignored, listings that page.

A fixture a subclass forgot fails every test that needs it with a message that names it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import ClassVar

import pytest

from plancache import PlanStore, PutOutcome, open_store
from plancache._keys import plan_object_name
from plancache._units import GiB
from plancache.testing.contract import StoreContract, StoreSpec, WriteRaw, missing_fixture
from plancache.testing.plans import make_plan
from plancache.testing.servers import CountingProxy


class ObjectStoreContract(StoreContract):
    """``StoreContract`` plus the costs and layout of an object store reached over HTTP.

    Besides ``store_spec`` (or ``store_factory``), a subclass provides:

    - ``request_proxy``: a ``CountingProxy`` in front of the service, no requests recorded;
    - ``proxied_store_spec``: ``(url, storage_options)`` of the same store through that proxy;
    - ``write_object``: a callable ``(name, data)`` storing ``data`` verbatim as the object
      ``name``, relative to the store's URL (``write_raw`` writes plan records with it);
    - ``read_object``: a callable ``name -> (content_type, data)`` reading an object with the
      service's standard tools (boto3, the JSON API), ``name`` relative to the store's URL;

    and the class attributes ``create_method`` and ``replace_method`` (the HTTP methods of a
    conditional create and replace) and ``replace_marker`` (a text the replace request's
    path carries, or ``""``), and, where it is not 1, ``first_miss_requests``.
    """

    create_method: ClassVar[str] = ""
    replace_method: ClassVar[str] = ""
    replace_marker: ClassVar[str] = ""
    first_miss_requests: ClassVar[int] = 1
    """Requests of a fresh store's first read of an absent object (every later one: 1)."""

    @pytest.fixture
    def request_proxy(self) -> CountingProxy:
        """A counting proxy in front of the service, with no requests recorded."""
        raise missing_fixture(
            self, "request_proxy", "a CountingProxy in front of the service, reset", see=__name__
        )

    @pytest.fixture
    def proxied_store_spec(self) -> StoreSpec:
        """``(url, storage_options)`` of the store under test, reached through the proxy."""
        raise missing_fixture(
            self,
            "proxied_store_spec",
            "(url, storage_options) of the store under test, reached through 'request_proxy'",
            see=__name__,
        )

    @pytest.fixture
    def write_object(self) -> WriteRaw:
        """A callable ``(name, data)`` storing an object verbatim, ``name`` relative to the
        store's URL."""
        raise missing_fixture(
            self,
            "write_object",
            "a callable (name, data) that stores data verbatim as the object name, "
            "relative to the store's URL",
            see=__name__,
        )

    @pytest.fixture
    def read_object(self) -> Callable[[str], tuple[str, bytes]]:
        """A callable ``name -> (content_type, data)`` using the service's standard tools."""
        raise missing_fixture(
            self,
            "read_object",
            "a callable name -> (content_type, data) reading an object with the service's "
            "standard tools, name relative to the store's URL",
            see=__name__,
        )

    @pytest.fixture
    def write_raw(self, write_object: WriteRaw) -> WriteRaw:
        """Plan records are objects named ``plan_object_name(fingerprint)``."""
        return lambda fp, data: write_object(plan_object_name(fp), data)

    @pytest.fixture
    def counted(self, proxied_store_spec: StoreSpec) -> Iterator[PlanStore]:
        """The store under test, through ``request_proxy``."""
        url, options = proxied_store_spec
        store = open_store(url, **options)
        yield store
        store.close()

    @staticmethod
    def methods(proxy: CountingProxy) -> list[str]:
        """The HTTP methods ``proxy`` forwarded since its last reset."""
        return [method for method, _ in proxy.requests]

    @pytest.fixture
    def request_methods(self) -> tuple[str, str]:
        """``(create_method, replace_method)``; fails when the subclass set neither."""
        for attr in ("create_method", "replace_method"):
            if not getattr(self, attr):
                raise NotImplementedError(
                    f"{type(self).__name__} must set {attr!r}: the HTTP method of a "
                    f"conditional write (PUT on S3, POST on GCS) (see {__name__})"
                )
        return self.create_method, self.replace_method

    def test_one_request_per_read_and_create(
        self, counted: PlanStore, request_proxy: CountingProxy, request_methods: tuple[str, str]
    ) -> None:
        create, _ = request_methods
        plan = make_plan()
        assert counted.get(plan.fingerprint) is None
        assert self.methods(request_proxy) == ["GET"] * self.first_miss_requests
        request_proxy.reset()
        assert counted.get(make_plan(factors={"other": 1}).fingerprint) is None
        assert self.methods(request_proxy) == ["GET"]
        request_proxy.reset()
        assert counted.put(plan) is PutOutcome.CREATED
        assert self.methods(request_proxy) == [create]
        request_proxy.reset()
        assert counted.get(plan.fingerprint) == plan
        assert self.methods(request_proxy) == ["GET"]

    def test_merge_costs(
        self,
        counted: PlanStore,
        proxied_store_spec: StoreSpec,
        request_proxy: CountingProxy,
        request_methods: tuple[str, str],
    ) -> None:
        """A writer that saw the record reads it first (a create would be refused); one
        that never did creates first; neither writes what the stored frontier covers."""
        create, replace = request_methods
        counted.put(make_plan())
        request_proxy.reset()
        assert counted.put(make_plan()) is PutOutcome.KEPT
        assert self.methods(request_proxy) == ["GET"]
        request_proxy.reset()
        assert counted.put(make_plan(kv=11 * GiB)) is PutOutcome.REPLACED
        assert self.methods(request_proxy) == ["GET", replace]
        assert self.replace_marker in request_proxy.requests[-1][1]
        url, options = proxied_store_spec
        fresh = open_store(url, **options)  # a writer that never saw the record
        try:
            request_proxy.reset()
            assert fresh.put(make_plan(kv=12 * GiB)) is PutOutcome.REPLACED
            assert self.methods(request_proxy) == [create, "GET", replace]
            request_proxy.reset()
            assert fresh.put(make_plan(kv=12 * GiB)) is PutOutcome.KEPT
            assert self.methods(request_proxy) == ["GET"]
        finally:
            fresh.close()

    def test_a_conditional_delete_costs_a_read_and_a_delete(
        self, counted: PlanStore, request_proxy: CountingProxy
    ) -> None:
        plan = make_plan()
        counted.put(plan)
        request_proxy.reset()
        assert counted.delete_if(plan.fingerprint, lambda raw: True) is True
        assert self.methods(request_proxy) == ["GET", "DELETE"]

    def test_objects_are_readable_by_standard_tools(
        self, store: PlanStore, read_object: Callable[[str], tuple[str, bytes]]
    ) -> None:
        plan = make_plan()
        store.put(plan)
        assert read_object(plan_object_name(plan.fingerprint)) == (
            "application/json",
            plan.encode(),
        )

    def test_other_objects_under_the_prefix_are_ignored(
        self, store: PlanStore, write_object: WriteRaw
    ) -> None:
        plan = make_plan()
        for name in [
            "notes.txt",
            "startup_plan_zz.json",
            f"sub/{plan_object_name(plan.fingerprint)}",
        ]:
            write_object(name, b"{}")
        assert list(store.iter_fingerprints()) == []
        store.put(plan)
        assert list(store.iter_fingerprints()) == [plan.fingerprint]

    def test_listing_pages(self, store: PlanStore) -> None:
        if not hasattr(store.layer, "list_page_size"):
            pytest.skip("the store has no list_page_size to make listings page")
        store.layer.list_page_size = 2
        plans = [make_plan(factors={"i": i}) for i in range(5)]
        for p in plans:
            store.put(p)
        assert sorted(store.iter_fingerprints()) == sorted(p.fingerprint for p in plans)
