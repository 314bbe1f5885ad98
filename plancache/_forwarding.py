"""Stores that wrap another (a tier, a lazy opening, a write guard): ``ForwardingStore``,
their base, and ``beneath``, the walk down a stack of them.

A forwarding store reaches the store it wraps through its public methods only, never its
primitives: it runs no compare-and-swap loop of its own.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator

from plancache._objects import CREATE, Opened, WriteMode
from plancache._plan import Plan
from plancache._signing import Keyring
from plancache._store import STALE_TEMP_SECONDS, PlanStore, Put


def beneath(store: PlanStore) -> Iterator[PlanStore]:
    """``store`` and the stores it forwards to, outermost first (a ``LazyStore`` is opened
    on the way, within its bound)."""
    while True:
        yield store
        if not isinstance(store, ForwardingStore):
            return
        store = store.inner


class ForwardingStore(PlanStore):
    """A store that adds behaviour in front of another (``inner``: a tier, a lazy opening, a
    write guard) and reaches it through its public methods only. Every public method goes to
    ``inner`` unless a subclass overrides it, except ``put`` and ``retract``, which stay
    ``put_merged``'s and ``rewrite``'s (``PlanStore``'s): an override of those two covers
    them. The keyring and the object layer go to ``inner`` too: a forwarding store runs no
    compare-and-swap loop of its own."""

    @property
    @abstractmethod
    def inner(self) -> PlanStore:
        """The store the public methods go to."""

    @property
    def url(self) -> str:
        return self.inner.url

    @property
    def atomic(self) -> bool:  # type: ignore[override]
        return self.inner.atomic

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"

    def use_keyring(self, keyring: Keyring) -> None:
        super().use_keyring(keyring)
        self.inner.use_keyring(keyring)

    def warm(self) -> None:
        """Start opening, on daemon threads, the stores beneath this one that open on first
        use (``LazyStore``: a tier's remote store, say); returns at once."""
        inner = self.inner
        if isinstance(inner, ForwardingStore):
            inner.warm()

    def get(self, fp: str) -> Plan | None:
        return self.inner.get(fp)

    def find(self, fp: str, usable: Callable[[Plan], bool]) -> Plan | None:
        return self.inner.find(fp, usable)

    def put_merged(self, plan: Plan) -> Put:
        return self.inner.put_merged(plan)

    def rewrite(self, fp: str, change: Callable[[Plan], Plan | None]) -> Plan | None:
        return self.inner.rewrite(fp, change)

    def delete_if(self, fp: str, doomed: Callable[[bytes], bool]) -> bool:
        return self.inner.delete_if(fp, doomed)

    def delete(self, fp: str) -> bool:
        return self.inner.delete(fp)

    def iter_fingerprints(self) -> Iterator[str]:
        return self.inner.iter_fingerprints()

    def read_raw(self, fp: str) -> bytes | None:
        return self.inner.read_raw(fp)

    def close(self) -> None:
        self.inner.close()

    def known_to_ignore_preconditions(self) -> bool:
        return self.inner.known_to_ignore_preconditions()

    def remove_stale_temp_files(
        self, older_than: float = STALE_TEMP_SECONDS, *, dry_run: bool = False, name: str = ""
    ) -> int:
        return self.inner.remove_stale_temp_files(older_than, dry_run=dry_run, name=name)

    # -- the object layer goes to ``inner`` too ----------------------------------------------
    def read_object(self, name: str, limit: int) -> tuple[bytes, object] | None:
        return self.inner.read_object(name, limit)

    def open_object(self, name: str) -> Opened | None:
        return self.inner.open_object(name)

    def write_object(self, name: str, chunks: Iterable[bytes], mode: WriteMode = CREATE) -> bool:
        return self.inner.write_object(name, chunks, mode)

    def delete_object(self, name: str, version: object | None = None) -> bool:
        return self.inner.delete_object(name, version)

    def list_objects(self, prefix: str) -> Iterator[str]:
        return self.inner.list_objects(prefix)
