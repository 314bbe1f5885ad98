"""The one trust rule of the kinds loaded as code or trusted as fact (compile artifacts, cache
bundles, model info), its typed refusals, and the rule of copying them between stores.

Guarantees:

- with any signing or verify key configured, only objects validly signed by an accepted key
  are used, from any store;
- without a key, objects from a local store or the local tier are used only where no other
  user could have written them (the directory and the file owned by this user or root,
  neither writable by group or others: ``_backends.local.foreign_writers``; else refused,
  with one warning per place naming it and the fix: ``warn_foreign``), and objects from a
  remote store only with ``PLANCACHE_COMPILE_TRUST_UNSIGNED=1``, and never unsigned from a
  store the conformance probe found to ignore write preconditions (``plancache._probe``);
- an object the rule would refuse from a source is not even downloaded from it
  (``Trust.may_download``);
- a refusal is a ``Refused`` carrying its ``Refusal``: callers tell refusals apart by type,
  never by message;
- ``copy_refusal``: a copy never makes code more trusted than it was.

Nothing here knows a backend: what a store is known to be is asked of the store
(``ObjectLayer.known_to_ignore_preconditions``).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from typing import Protocol

from plancache._objects import ObjectLayer
from plancache._plan import Signature
from plancache._reasons import Reason
from plancache._signing import Keyring, SignatureVerdict
from plancache.errors import ArtifactError

log = logging.getLogger("plancache")


class Refusal(enum.Enum):
    """Why an object is not used; each value is the text of the refusal (``{}``: its
    detail)."""

    UNSIGNED_REMOTE = "untrusted: unsigned, from a remote store"
    UNSIGNED_FOREIGN = "untrusted: unsigned, and {}"
    UNSIGNED_LYING_STORE = "untrusted: unsigned, from a store that ignores write preconditions"
    BAD_SIGNATURE = "invalid:signature ({})"
    CRASHED_BEFORE = "gate:crashed-before (a boot on this node died with it)"
    DECLINED = "{}"
    """A caller's own reason (its text is the detail)."""

    @property
    def untrusted(self) -> bool:
        """True where the object may be sound but its origin is not trusted (unsigned)."""
        return self in (
            Refusal.UNSIGNED_REMOTE,
            Refusal.UNSIGNED_FOREIGN,
            Refusal.UNSIGNED_LYING_STORE,
        )


class Refused(ArtifactError):
    """An object refused (nothing of it used): ``refusal`` says why, ``detail`` adds the
    particulars; the message is ``<what> refused: <text>``."""

    def __init__(self, refusal: Refusal, detail: str = "", what: str = "artifact") -> None:
        self.refusal, self.detail = refusal, detail
        self.why = refusal.value.format(detail)
        super().__init__(f"{what} refused: {self.why}")

    @property
    def reason(self) -> Reason:
        """The reason code of a fetch refused so: ``untrusted`` or ``invalid``."""
        return Reason.UNTRUSTED if self.refusal.untrusted else Reason.INVALID


def refused(reason: Refused | str) -> Refused:
    """``reason`` as a refusal: a caller's own text is ``Refusal.DECLINED``."""
    return reason if isinstance(reason, Refused) else Refused(Refusal.DECLINED, reason)


class Signed(Protocol):
    """What an object says of its signature (a manifest, an envelope)."""

    @property
    def signature(self) -> Signature | None: ...

    def verdict(self, keyring: Keyring, /) -> SignatureVerdict: ...


def signature_refusal(
    keyring: Keyring, verdict: Callable[[Keyring], SignatureVerdict]
) -> Refused | None:
    """Where ``keyring`` requires signatures: None if ``verdict`` (an object's signature
    under a keyring) is valid, else ``BAD_SIGNATURE``; None where none is required."""
    if not keyring.requires_signature:
        return None
    judged = verdict(keyring)
    return None if judged is SignatureVerdict.VALID else Refused(Refusal.BAD_SIGNATURE, str(judged))


def copy_refusal(head: Signed, keyring: Keyring) -> str | None:
    """The rule of copying code between stores without ``--trust-unsigned``: None if
    ``keyring`` holds keys and an accepted one validly signed ``head``; else why not (a copy
    never makes code more trusted than it was: a node installs unsigned code from a local
    store without a key)."""
    verdict = head.verdict(keyring) if keyring.requires_signature else None
    if verdict is SignatureVerdict.VALID:
        return None
    why = "unsigned" if head.signature is None else f"signature {verdict}"
    return f"{why} (copying unsigned code needs --trust-unsigned, or keys)"


def lies(store: ObjectLayer) -> bool:
    """True if ``store`` is already known to ignore write preconditions (no probe is run:
    a fetch's path never probes)."""
    try:
        return store.known_to_ignore_preconditions()
    except Exception:  # cannot open the client: the fetch reports the store error
        return False


_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_foreign(where: str, why: str) -> None:
    """One warning per process and place: unsigned code from a place other users could
    have written is refused, and how to fix it."""
    with _warned_lock:
        if where in _warned:
            return
        _warned.add(where)
    log.warning(
        "plancache: compile artifacts in %s are not installed unsigned: %s; make the directory "
        "and its files this user's and not writable by group or others (chmod 755 / 644), or "
        "sign artifacts (PLANCACHE_SIGNING_KEY)",
        where,
        why,
    )


class Trust:
    """The rule (see the module docstring) under ``keyring``, trusting unsigned objects
    from a remote ``store`` if ``trust_unsigned``."""

    def __init__(self, keyring: Keyring, trust_unsigned: bool, store: ObjectLayer) -> None:
        self.keyring, self.trust_unsigned, self.store = keyring, trust_unsigned, store

    def may_download(self, local: bool) -> bool:
        """False where every object of a source (a local one if ``local``) would be refused
        unread: a remote store, unsigned objects not trusted, no key to judge them by."""
        return local or self.trust_unsigned or self.keyring.requires_signature

    def refusal(
        self,
        verdict: Callable[[Keyring], SignatureVerdict],
        local: bool,
        foreign: str | None = None,
    ) -> Refused | None:
        """None to use an object (from a local source if ``local``; ``foreign``: why others
        could have written it there; ``verdict``: its signature's, under a keyring), else
        why not."""
        if self.keyring.requires_signature:
            return signature_refusal(self.keyring, verdict)
        if local:
            return None if foreign is None else Refused(Refusal.UNSIGNED_FOREIGN, foreign)
        if not self.trust_unsigned:
            return Refused(Refusal.UNSIGNED_REMOTE)
        if lies(self.store):
            return Refused(Refusal.UNSIGNED_LYING_STORE)
        return None
