"""The ``PlanStore`` contract and the one merge loop (no I/O libraries).

Backends implement five primitives (read with a version token, create-if-absent,
replace-if-version-matches, delete, list); everything else, including the merge of
concurrent writers and the signing of what is written (``PlanStore.keyring``, see
``plancache.signing``), lives here once.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from plancache.errors import (
    InvalidPlanError,
    PlanStoreConflictError,
    PlanStorePermissionError,
    UnsupportedSchemaError,
)
from plancache.fingerprint import validate_key
from plancache.merge import merge, retract
from plancache.observation import Observation
from plancache.plan import MAX_RECORD_BYTES, SCHEMA, Plan
from plancache.signing import NO_KEYS, Keyring

log = logging.getLogger("plancache")

CONTENT_TYPE = "application/json"
READ_LIMIT = MAX_RECORD_BYTES + 1
"""Readers fetch at most this many bytes; a longer record is invalid without reading it all."""


def content_version(data: bytes) -> str:
    """A version token for stores without native versions: the sha256 of the bytes (unlike
    inode or mtime, never reused for other content)."""
    return hashlib.sha256(data).hexdigest()


class PutOutcome(enum.Enum):
    """What ``PlanStore.put`` did."""

    CREATED = "created"
    REPLACED = "replaced"
    KEPT = "kept"


@dataclass(frozen=True)
class Retraction:
    """What ``PlanStore.retract`` did."""

    record: Plan | None
    """The record stored afterwards (None: the store holds none under the key)."""
    removed: bool
    """True if the record held the observation when it was read and no longer does (the
    retraction took effect); False if it changed nothing a lookup sees (no record, or one
    without that observation, which still gets its tombstone)."""


class PlanStore(ABC):
    """Where plans live. Guarantees, for every backend that passes the conformance suite:

    - ``get`` returns a valid plan, None for a missing one, or raises ``InvalidPlanError``
      for a record that breaks a rule (``InvalidSignatureError`` for one the keyring does
      not accept); never a torn record.
    - ``put`` is atomic and merges: the stored record becomes the merge of it and the new one
      (signed, or kept, as the keyring's rules say).
    - transport and permission failures raise ``PlanStoreError`` subclasses.
    - every key is validated before any I/O.
    """

    #: False where the backend cannot make create/replace atomic (documented per backend).
    atomic: bool = True
    #: Bound on the merge loop's attempts when racing writers keep winning.
    max_put_attempts: int = 16
    #: Signs what the store writes and judges what it reads (``plancache.signing``).
    keyring: Keyring = NO_KEYS

    def use_keyring(self, keyring: Keyring) -> None:
        """Sign and judge records with ``keyring`` from now on (``Settings.open_store`` does
        this with the configured keys)."""
        self.keyring = keyring

    @property
    @abstractmethod
    def url(self) -> str:
        """The store's location, without secrets."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # -- primitives each backend implements -------------------------------------------
    @abstractmethod
    def _read(self, fp: str) -> tuple[bytes, object] | None:
        """At most ``READ_LIMIT`` bytes of the record and a version token; None if absent."""

    @abstractmethod
    def _create(self, fp: str, data: bytes) -> bool:
        """Write ``data`` only if no record exists; False if one does. Atomic."""

    @abstractmethod
    def _replace(self, fp: str, data: bytes, version: object) -> bool:
        """Overwrite only if the stored version is still ``version``; False otherwise."""

    @abstractmethod
    def _delete(self, fp: str) -> bool:
        """Remove the record; False if it was absent."""

    @abstractmethod
    def _list(self) -> Iterator[str]:
        """Fingerprints of stored records (names that are not plans are skipped)."""

    # -- the public contract ------------------------------------------------------------
    def get(self, fp: str) -> Plan | None:
        """The valid plan stored under ``fp``, or None. Invalid records raise
        ``InvalidPlanError`` (``InvalidSignatureError`` where the keyring holds keys and none
        of them signed the record); store failures raise ``PlanStoreError``."""
        found = self._read(validate_key(fp))
        if found is None:
            return None
        return self.keyring.check(Plan.decode(found[0], expected_fingerprint=fp))

    def find(self, fp: str, usable: Callable[[Plan], bool]) -> Plan | None:
        """Like ``get``; stores with several tiers keep looking while the plan they found
        is not ``usable`` (e.g. the gate rejects it), and return the best they found."""
        return self.get(fp)

    def put(self, plan: Plan) -> PutOutcome:
        """Merge ``plan`` into the record under its key; see ``put_merged``."""
        return self.put_merged(plan)[0]

    def put_merged(self, plan: Plan) -> tuple[PutOutcome, Plan | None]:
        """(outcome, the record now stored; None where that is another schema's).

        Merges ``plan`` into the record under its key (``plancache.merge``): create it,
        else replace the stored record by the merge when that changes it (also to upgrade a
        schema-1 record, or to replace an invalid one), else keep it. A record of an
        unknown schema is kept, never overwritten. Lost races re-read and merge again, at
        most ``max_put_attempts`` times, then ``PlanStoreConflictError``. No observation of
        a CREATED or REPLACED put is lost unless the merge's bound or dominance drops it.

        Signatures (``self.keyring``, rules in ``plancache.signing``): with a signing key,
        what is written is signed, and a stored record without a valid signature counts as
        invalid (replaced by ``plan`` alone); without one, a signed record is never replaced
        by an unsigned merge (KEPT). A record of an unknown schema that no accepted key
        signed is replaced by a write that one does (``Keyring.displaces``)."""
        keys = self.keyring
        fp = validate_key(plan.fingerprint)
        new = keys.seal(plan)
        data = new.encode()
        for _ in range(self.max_put_attempts):
            if self._create(fp, data):
                return PutOutcome.CREATED, new
            found = self._read(fp)
            if found is None:  # deleted since: try to create again
                continue
            raw, version = found
            try:
                stored = keys.base(Plan.decode(raw, expected_fingerprint=fp))
            except UnsupportedSchemaError as exc:
                if not keys.displaces(raw, new):
                    return PutOutcome.KEPT, None  # another version's record: not ours to replace
                log.warning(
                    "plancache: replacing record %s… that no accepted key signed: %s", fp[:12], exc
                )
                merged = new
            except InvalidPlanError as exc:
                log.warning("plancache: replacing invalid record %s…: %s", fp[:12], exc)
                merged = new
            else:
                changed = merge(stored, new)
                if changed == stored and stored.schema == SCHEMA and keys.settled(stored):
                    return PutOutcome.KEPT, stored
                merged = keys.seal(new if changed == new else changed)  # a copy keeps its signature
                if not keys.may_replace(stored, merged):
                    log.warning(
                        "plancache: record %s… is signed and this writer holds no signing key "
                        "(PLANCACHE_SIGNING_KEY): kept as it is",
                        fp[:12],
                    )
                    return PutOutcome.KEPT, stored
            if self._replace(fp, merged.encode(), version):
                return PutOutcome.REPLACED, merged
        raise PlanStoreConflictError(
            f"{self.url}: gave up on {fp[:12]}… after {self.max_put_attempts} lost races"
        )

    def rewrite(self, fp: str, change: Callable[[Plan], Plan | None]) -> Plan | None:
        """Replace the valid record under ``fp`` by ``change(record)`` through the same
        compare-and-swap as ``put`` (None from ``change`` deletes the record); returns what
        is stored afterwards. A missing record stays missing and ``change`` is not called;
        an invalid one raises ``InvalidPlanError``. Lost races re-read and call ``change``
        again, at most ``max_put_attempts`` times. (A delete is not conditional: a record
        written between the last read and the delete is lost with it.)

        Signatures as in ``put_merged``: with a signing key, the result is signed (an
        unchanged record signed by another accepted key is re-signed) and a record without a
        valid signature raises ``InvalidSignatureError``; without one, changing a signed
        record raises ``PlanStorePermissionError``."""
        validate_key(fp)
        keys = self.keyring
        for _ in range(self.max_put_attempts):
            found = self._read(fp)
            if found is None:
                return None
            raw, version = found
            stored = keys.base(Plan.decode(raw, expected_fingerprint=fp))
            changed = change(stored)
            if changed is None:
                self._delete(fp)
                return None
            if changed.fingerprint != fp:
                raise ValueError("a rewrite cannot change the record's fingerprint")
            if changed == stored and stored.schema == SCHEMA and keys.settled(stored):
                return stored
            sealed = keys.seal(changed)
            if not keys.may_replace(stored, sealed):
                raise PlanStorePermissionError(
                    f"{self.url}: record {fp[:12]}… is signed; changing it needs the signing "
                    "key (PLANCACHE_SIGNING_KEY)"
                )
            if self._replace(fp, sealed.encode(), version):
                return sealed
        raise PlanStoreConflictError(
            f"{self.url}: gave up on {fp[:12]}… after {self.max_put_attempts} lost races"
        )

    def retract(self, fp: str, observation: Observation, at: float | None = None) -> Retraction:
        """Remove ``observation`` from the record under ``fp`` and keep its tombstone (always:
        ``plancache.merge.retract``), through ``rewrite``'s compare-and-swap; returns the
        record now stored and whether the observation was removed (a missing record is not
        created: nothing to retract). Every other observation stays. When no observation is
        left the record is kept with its tombstones only (it applies nowhere), so that an
        older copy merged later cannot bring the observation back; ``plancache prune``
        forgets it once the observation itself would be pruned."""
        when = time.time() if at is None else at
        held: list[bool] = []

        def change(plan: Plan) -> Plan:
            held.append(any(o.digest == observation.digest for o in plan.observations))
            return retract(plan, observation, when)

        record = self.rewrite(fp, change)
        return Retraction(record, any(held))

    def delete(self, fp: str) -> bool:
        """Remove the plan under ``fp``; True if one was there."""
        return self._delete(validate_key(fp))

    def iter_fingerprints(self) -> Iterator[str]:
        """Every stored fingerprint, in no particular order."""
        return self._list()

    def read_raw(self, fp: str) -> bytes | None:
        """The stored bytes under ``fp`` (at most ``READ_LIMIT``), unvalidated; for tools."""
        found = self._read(validate_key(fp))
        return None if found is None else found[0]

    def close(self) -> None:
        """Release resources held by the store (sessions, pools). Idempotent."""
