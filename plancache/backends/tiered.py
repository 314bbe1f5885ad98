"""A local directory tier in front of a remote store, with an optional read-only mode.

Reads: local first, then remote when the local tier has no plan, an invalid one, or one the
caller cannot use (``find``, e.g. a plan the gate rejects); a remote hit is copied into the
local tier. Writes: remote first (skipped in read-only mode), then local. The local tier is a cache:
its failures are logged and never fail a read or write that the remote served.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from plancache.errors import InvalidPlanError, PlanStoreError, PlanStoreReadOnlyError
from plancache.plan import Plan
from plancache.store import PlanStore, PutOutcome

log = logging.getLogger("plancache")


class TieredStore(PlanStore):
    """``remote`` behind an optional ``local`` tier; ``read_only`` never writes ``remote``."""

    def __init__(
        self, remote: PlanStore, *, local: PlanStore | None = None, read_only: bool = False
    ) -> None:
        self.remote = remote
        self.local = local
        self.read_only = read_only

    @property
    def atomic(self) -> bool:  # type: ignore[override]
        return self.remote.atomic and (self.local is None or self.local.atomic)

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
            raise PlanStoreReadOnlyError(f"{self.url} is opened read-only")

    def get(self, fp: str) -> Plan | None:
        """The local tier's plan, else the remote's (copied into the local tier)."""
        return self.find(fp, lambda plan: True)

    def find(self, fp: str, usable: Callable[[Plan], bool]) -> Plan | None:
        """The local tier's plan if ``usable`` accepts it; else the remote's (copied into the
        local tier, where it replaces a plan it dominates), else the local one."""
        local = self._get_local(fp)
        if local is not None and usable(local):
            return local
        plan = self.remote.get(fp)
        if plan is None:
            return local
        if plan != local:
            self._put_local(plan)
        return plan

    def put(self, plan: Plan) -> PutOutcome:
        """The remote's outcome (merge semantics); the local tier then gets the plan the
        remote keeps. If the remote fails, the local tier still gets ``plan`` (this node
        need not profile again) and the error is raised. Read-only: the local tier's
        outcome; without a local tier, ``PlanStoreReadOnlyError``."""
        if self.read_only:
            if self.local is None:
                raise PlanStoreReadOnlyError(
                    f"{self.url} is opened read-only and has no local tier"
                )
            return self.local.put(plan)
        try:
            outcome = self.remote.put(plan)
        except PlanStoreError:
            if self.local is not None:
                self._put_local(plan)
            raise
        if self.local is not None:
            winner: Plan | None = plan
            if outcome is PutOutcome.KEPT:
                try:
                    winner = self.remote.get(plan.fingerprint)
                except InvalidPlanError:  # another version's record: nothing to copy
                    winner = None
            if winner is not None:
                self._put_local(winner)
        return outcome

    def delete(self, fp: str) -> bool:
        """Remove from the remote (not in read-only mode) and from the local tier."""
        removed = False if self.read_only else self.remote.delete(fp)
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
