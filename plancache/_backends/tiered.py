"""The plans kind over two layers: a local directory tier in front of a remote store, with
an optional read-only mode (``TieredStore``: a ``PlanStore`` composed of two).

Reads: local first, then remote when the local tier has no plan, an invalid one, or one the
caller cannot use (``find``, e.g. a plan the gate rejects); a remote hit is copied into the
local tier. Writes: local first (the node keeps what it measured, however slow the remote),
then remote (skipped in read-only mode, and where the remote refuses writes with
``PlanStoreReadOnlyError``, e.g. a store found to ignore preconditions), whose merged record
the local tier then takes. The local tier is a cache: its failures are logged and never fail
a read or write that the remote served. A plan written to the local tier whose remote write
has not succeeded (yet: a slow store, a process that exited, an error) keeps a mark there
(``unshared_<key>``); warming the store (``warm``: the plugin does when a worker starts)
offers the marked plans to the remote again in a daemon thread, so that no observation stays
on one node. The keyring
(``use_keyring``) applies to both tiers: a local record without a valid signature is not
applied, it is logged and the remote is read instead.

The object layer (``layer``) is the remote's; in read-only mode a ``ReadOnlyLayer`` whose
writes and deletes raise ``PlanStoreReadOnlyError``. Kinds that read both tiers (compile
artifacts) reach the local tier's layer as ``local_tier``.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable
from typing import NoReturn, TypeVar

from plancache import _background as background
from plancache import _reader as reader
from plancache._forwarding import ForwardingLayer
from plancache._keys import is_key_prefix, validate_key
from plancache._objects import CREATE, ObjectLayer, WriteMode
from plancache._plan import Plan
from plancache._signing import Keyring
from plancache._store import PlanStore, Put
from plancache.errors import (
    InvalidPlanError,
    PlanStoreError,
    PlanStoreReadOnlyError,
    PlanStoreUnavailableError,
)

log = logging.getLogger("plancache")
T = TypeVar("T")


def _is_key(text: str) -> bool:
    return len(text) == 64 and is_key_prefix(text)


UNSHARED_PREFIX = "unshared_"
"""The local tier's marks of plans not written to the remote yet."""
MAX_OFFERS = 64
"""Most marked plans one warm offers to the remote (the rest: a later boot)."""
MAX_MARKS = 16 * MAX_OFFERS
"""Most marks one warm reads (those past it: once earlier ones are shared or gone)."""


class ReadOnlyLayer(ForwardingLayer):
    """``inner`` whose writes and deletes raise ``PlanStoreReadOnlyError`` (the store is
    opened read-only); reads and listings go through."""

    def __init__(self, inner: ObjectLayer) -> None:
        self._inner = inner

    @property
    def inner(self) -> ObjectLayer:
        return self._inner

    def _refuse(self) -> NoReturn:
        raise PlanStoreReadOnlyError(f"{self.url} is opened read-only: not written")

    def check_writable(self) -> None:
        self._refuse()

    def write_object(self, name: str, chunks: Iterable[bytes], mode: WriteMode = CREATE) -> bool:
        self._refuse()

    def delete_object(self, name: str, version: object | None = None) -> bool:
        self._refuse()


class TieredStore(PlanStore):
    """``remote`` behind an optional ``local`` tier; ``read_only`` never writes ``remote``.
    Both tiers are reached through their public methods; listing and raw reads are the
    remote's (``layer``: the remote's, read-only in read-only mode)."""

    def __init__(
        self, remote: PlanStore, *, local: PlanStore | None = None, read_only: bool = False
    ) -> None:
        super().__init__(ReadOnlyLayer(remote.layer) if read_only else remote.layer)
        self.remote = remote
        self.local = local
        self.read_only = read_only

    @property
    def local_tier(self) -> ObjectLayer | None:
        return None if self.local is None else self.local.layer

    @property
    def atomic(self) -> bool:
        return self.remote.atomic and (self.local is None or self.local.atomic)

    def use_keyring(self, keyring: Keyring) -> None:
        """Sign and judge records with ``keyring`` in both tiers."""
        super().use_keyring(keyring)
        self.remote.use_keyring(keyring)
        if self.local is not None:
            self.local.use_keyring(keyring)

    def __repr__(self) -> str:
        mode = ", read_only=True" if self.read_only else ""
        return f"TieredStore({self.remote!r}, local={self.local!r}{mode})"

    def get(self, fp: str) -> Plan | None:
        """The local tier's plan, else the remote's (copied into the local tier)."""
        return self.find(fp, lambda plan: True)

    def find(self, fp: str, usable: Callable[[Plan], bool]) -> Plan | None:
        """The local tier's plan if ``usable`` accepts it; else the remote's merged into the
        local tier (so the local tier's tombstones still hold), else the local one."""
        local = self._get_local(fp)
        if local is not None and usable(local):
            return local
        plan = self.remote.get(fp)
        if plan is None:
            return local
        if plan != local and self.local is not None:
            return self._put_local(plan) or plan
        return plan

    def put_merged(self, plan: Plan) -> Put:
        """The remote's outcome and record (merge semantics). The local tier merges ``plan``
        first, so this node keeps what it measured however long the remote takes (a record
        bounded by its budget goes on in the background), then the record the remote now
        holds. If the remote fails, its error is raised. Read-only, or where the remote
        refuses writes: the local tier's outcome; without a local tier,
        ``PlanStoreReadOnlyError``."""
        if self.read_only and self.local is None:
            raise PlanStoreReadOnlyError(f"{self.url} is opened read-only and has no local tier")
        if self.local is None:
            return self.remote.put_merged(plan)
        try:
            local: Put | None = self.local.put_merged(plan)
        except PlanStoreError as exc:
            if self.read_only:
                raise
            log.warning("plancache: local tier %s not updated: %s", self.local.url, exc)
            local = None
        if self.read_only:
            assert local is not None
            return local
        mark = UNSHARED_PREFIX + plan.fingerprint
        marked = local is not None and self._local_object(lambda t: t.write_object(mark, [b""]))
        try:
            outcome, stored = self.remote.put_merged(plan)
        except PlanStoreReadOnlyError:  # the remote refuses writes: as if opened read-only
            if marked:  # nothing to offer it later
                self._local_object(lambda t: t.delete_object(mark))
            if local is None:
                raise
            return local
        if marked:
            self._local_object(lambda t: t.delete_object(mark))
        if stored is not None and (local is None or stored != local[1]):
            self._put_local(stored)
        return outcome, stored

    def warm(self) -> None:
        """Start opening the remote (``PlanStore.warm``) and offering it the plans the local
        tier marks as not shared yet, on daemon threads; returns at once."""
        self.remote.warm()
        if self.local is not None and not self.read_only:
            background.start(self.offer_unshared, "plancache-offer")

    def offer_unshared(self) -> int:
        """Write to the remote (merged) each plan the local tier marks as not shared yet, one
        by one (at most ``MAX_OFFERS`` written, ``MAX_MARKS`` marks read), removing each mark
        once its plan is written. Only marks and records no other local user could have
        written are offered (``PlanStore.own``): the node's credentials never ship what a
        neighbour planted. A mark whose plan cannot be read or written (a neighbour's, a
        record kept unsigned before the fleet adopted a key, one the remote rejects) is logged
        and kept for a later boot, and holds back no other; a remote that does not answer or
        refuses writes ends the round (a later boot). How many were written. Never raises."""
        assert self.local is not None
        shared, own = 0, self.local.own()  # a neighbour's mark or record: never offered
        try:
            marks = list(
                itertools.islice(self.local.layer.list_objects(UNSHARED_PREFIX), MAX_MARKS)
            )
        except Exception as exc:
            log.info("plancache: plans not shared yet: marks not listed: %s", exc)
            return 0
        for name in marks:
            if shared >= MAX_OFFERS:
                break
            fp = name[len(UNSHARED_PREFIX) :]
            try:
                reader.read(own.layer, name, 1)  # the mark: this user's, or InvalidPlanError
                plan = own.get(validate_key(fp)) if _is_key(fp) else None
                if plan is not None:
                    self.remote.put_merged(plan)
                    shared += 1
                self.local.layer.delete_object(name)
            except (PlanStoreUnavailableError, PlanStoreReadOnlyError) as exc:  # a later boot
                log.info(
                    "plancache: plans not shared yet stay marked: %s: %s", type(exc).__name__, exc
                )
                break
            except Exception as exc:
                log.warning(
                    "plancache: the plan %s this node kept is not shared (its mark stays): %s: %s",
                    fp[:12],
                    type(exc).__name__,
                    exc,
                )
        if shared:
            log.info("plancache: %d plan(s) this node kept are now in %s", shared, self.remote.url)
        return shared

    def _local_object(self, call: Callable[[ObjectLayer], object]) -> bool:
        """``call`` on the local tier's layer; False (logged) where it fails."""
        assert self.local is not None
        try:
            call(self.local.layer)
        except PlanStoreError as exc:
            log.warning("plancache: local tier %s: %s", self.local.url, exc)
            return False
        return True

    def rewrite(self, fp: str, change: Callable[[Plan], Plan | None]) -> Plan | None:
        """Rewrite the remote's record (not in read-only mode), then the local tier's; the
        remote's result, or in read-only mode the local tier's."""
        return self._in_both(lambda store: store.rewrite(fp, change), None)

    def delete_if(self, fp: str, doomed: Callable[[bytes], bool]) -> bool:
        """Delete as judged (``PlanStore.delete_if``) from the remote (not in read-only
        mode), then from the local tier; the remote's result, or in read-only mode the local
        tier's."""
        return self._in_both(lambda store: store.delete_if(fp, doomed), True)

    def _in_both(self, call: Callable[[PlanStore], T], read_only_result: T) -> T:
        """``call`` on the remote (in read-only mode, or when the remote refuses writes,
        ``read_only_result`` instead), then on the local tier, whose failures are logged; the
        remote's result, or in read-only mode the local tier's."""
        read_only, result = self.read_only, read_only_result
        if read_only and self.local is None:
            raise PlanStoreReadOnlyError(f"{self.url} is opened read-only: not written")
        if not read_only:
            try:
                result = call(self.remote)
            except PlanStoreReadOnlyError:  # the remote refuses writes: as if opened read-only
                if self.local is None:
                    raise
                read_only = True
        if self.local is not None:
            try:
                local = call(self.local)
            except (InvalidPlanError, PlanStoreError) as exc:
                log.warning("plancache: local tier %s: %s", self.local.url, exc)
            else:
                result = local if read_only else result
        return result

    def delete(self, fp: str) -> bool:
        """Remove from the remote (not in read-only mode) and from the local tier."""
        removed = False
        if self.read_only and self.local is None:
            raise PlanStoreReadOnlyError(f"{self.url} is opened read-only: not written")
        if not self.read_only:
            try:
                removed = self.remote.delete(fp)
            except PlanStoreReadOnlyError:  # the remote refuses writes: as if opened read-only
                if self.local is None:
                    raise
        if self.local is not None:
            try:
                removed = self.local.delete(fp) or removed
            except PlanStoreError as exc:
                log.warning("plancache: local tier %s: %s", self.local.url, exc)
        return removed

    def _get_local(self, fp: str) -> Plan | None:
        if self.local is None:
            return None
        try:
            return self.local.get(fp)
        except (InvalidPlanError, PlanStoreError) as exc:
            log.warning("plancache: local tier %s: %s", self.local.url, exc)
            return None

    def _put_local(self, plan: Plan) -> Plan | None:
        """Merge ``plan`` into the local tier; the record it now holds (None on failure)."""
        assert self.local is not None
        try:
            return self.local.put_merged(plan)[1]
        except PlanStoreError as exc:
            log.warning("plancache: local tier %s not updated: %s", self.local.url, exc)
            return None

    def close(self) -> None:
        self.remote.close()
        if self.local is not None:
            self.local.close()
