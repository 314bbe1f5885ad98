"""A local directory tier in front of a remote store, with an optional read-only mode.

Reads: local first, then remote; a remote hit is backfilled into the local tier.
Writes: remote first (skipped in read-only mode), then local. The local tier is a cache:
its failures are logged and never fail a read or write that the remote served.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from plancache.plan import InvalidPlanError, Plan
from plancache.store import PlanStore, PlanStoreError, PutOutcome

log = logging.getLogger("plancache")


class ReadOnlyStoreError(PlanStoreError):
    """A write was asked of a store opened read-only."""


class TieredStore(PlanStore):
    """``remote`` behind an optional ``local`` tier; ``read_only`` never writes ``remote``."""

    def __init__(
        self, remote: PlanStore, *, local: PlanStore | None = None, read_only: bool = False
    ) -> None:
        self.remote = remote
        self.local = local
        self.read_only = read_only
        self.atomic = remote.atomic and (local is None or local.atomic)

    @property
    def url(self) -> str:
        return self.remote.url

    def __repr__(self) -> str:
        mode = ", read_only=True" if self.read_only else ""
        return f"TieredStore({self.remote!r}, local={self.local!r}{mode})"

    # Primitives act on the remote; the public methods below add the tier.
    def _read(self, fp: str) -> tuple[bytes, object] | None:
        return self.remote._read(fp)

    def _create(self, fp: str, data: bytes) -> bool:
        self._check_writable()
        return self.remote._create(fp, data)

    def _replace(self, fp: str, data: bytes, version: object) -> bool:
        self._check_writable()
        return self.remote._replace(fp, data, version)

    def _delete(self, fp: str) -> bool:
        self._check_writable()
        return self.remote._delete(fp)

    def _list(self) -> Iterator[str]:
        return self.remote._list()

    def _check_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyStoreError(f"{self.url} is opened read-only")

    def get(self, fp: str) -> Plan | None:
        """Local tier first; on a local miss or invalid record, the remote (backfilled)."""
        if self.local is not None:
            try:
                plan = self.local.get(fp)
            except (InvalidPlanError, PlanStoreError) as exc:
                log.warning("plancache: local tier %s: %s", self.local.url, exc)
            else:
                if plan is not None:
                    return plan
        plan = self.remote.get(fp)
        if plan is not None and self.local is not None:
            self._put_local(plan)
        return plan

    def put(self, plan: Plan) -> PutOutcome:
        """The remote's outcome (merge semantics), then the plan into the local tier.
        Read-only: the local tier's outcome; without a local tier, ``ReadOnlyStoreError``."""
        if self.read_only:
            if self.local is None:
                raise ReadOnlyStoreError(f"{self.url} is opened read-only and has no local tier")
            return self.local.put(plan)
        outcome = self.remote.put(plan)
        if self.local is not None:
            self._put_local(plan)
        return outcome

    def delete(self, fp: str) -> bool:
        """Remove from the remote (not in read-only mode) and from the local tier."""
        removed = False if self.read_only else self.remote.delete(fp)
        if self.local is not None:
            removed = self.local.delete(fp) or removed
        return removed

    def _put_local(self, plan: Plan) -> None:
        assert self.local is not None
        try:
            self.local.put(plan)
        except PlanStoreError as exc:
            log.warning("plancache: local tier %s not updated: %s", self.local.url, exc)

    def close(self) -> None:
        self.remote.close()
        if self.local is not None:
            self.local.close()
