"""Signed plans: keys, key ids, and the rules by which stores sign and judge records (pure).

A signature is the HMAC-SHA256 of a record's canonical encoding without its signature
(``Plan.payload``) under a secret key, stored in the record with the key's id
(``Plan.signature``). A key is a string of at least ``MIN_KEY_CHARS`` printable ASCII
characters other than spaces and commas (``openssl rand -hex 32`` makes one); its id is
derived from it (``key_id``: 16 hex digits of an HMAC of a fixed text under the key), so no
name has to be given and two different keys get different ids.

A ``Keyring`` holds an optional signing key and the accepted keys (the verify keys and the
signing key). Every store has one (``PlanStore.keyring``; ``NO_KEYS`` by default), and the
store's merge loop follows these rules through it:

- Reading (``check``): with no accepted key, a record is read as it is (a signature is
  carried, not judged). With accepted keys, only a record signed by one of them, whose
  signature matches its content, is used; any other raises ``InvalidSignatureError``
  (reason ``invalid:signature``).
- Writing with a signing key (``seal``): every record written is signed with it. The stored
  record is judged first (``base``): one that fails ``check`` is not trusted, so it is
  replaced by the new record alone (its observations are not merged in). A valid record
  signed by another accepted key is re-signed with the signing key at the next write.
- Writing without a signing key: records are written unsigned, except an unchanged copy of
  a signed record, which keeps its signature. Such a writer never replaces a signed record by
  one it cannot vouch for (``may_replace``): its put keeps the signed record and writes
  nothing, and its rewrite (retract, prune) raises ``PlanStorePermissionError``.
- A record of another schema (a newer plancache's) is judged by the rule every schema keeps
  (``check_foreign``): a ``signature`` whose HMAC covers the canonical encoding of the whole
  record without it. Only a write that an accepted key vouches for replaces such a record,
  and only when no accepted key vouches for it (``displaces``); without keys it is never
  replaced.

Keys appear in no ``repr``, message or log line; only their ids do.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
from collections.abc import Iterable

import orjson

from plancache._plan import KEY_ID_CHARS, Plan, Signature
from plancache._redaction import MASK
from plancache.errors import ConfigError, InvalidPlanError, InvalidSignatureError

MIN_KEY_CHARS = 16
"""Shortest key accepted."""
_KEY_ID_TEXT = b"plancache key id"
_SEPARATORS = re.compile(r"[\s,]+", re.ASCII)


class SignatureVerdict(enum.StrEnum):
    """What a keyring makes of a record's signature."""

    VALID = "valid"
    """Signed by an accepted key, and the signature matches the content."""
    UNSIGNED = "unsigned"
    UNKNOWN_KEY = "unknown-key"
    """Signed by a key this keyring does not accept."""
    BAD_MAC = "bad-mac"
    """Signed under an accepted key's id, but the signature does not match the content: the
    record changed after signing, or another key claims that id."""


def key_id(key: str) -> str:
    """The id of ``key``: the first 16 hex digits of HMAC-SHA256(key, "plancache key id")."""
    mac = hmac.new(key.encode(), _KEY_ID_TEXT, hashlib.sha256).hexdigest()
    return mac[:KEY_ID_CHARS]


def key_problem(key: str) -> str | None:
    """Why ``key`` cannot be a key (never quoting it), or None if it can."""
    if not (key.isascii() and key.isprintable()) or _SEPARATORS.search(key):
        return "holds whitespace, a comma or a character that is not printable ASCII"
    if len(key) < MIN_KEY_CHARS:
        return f"has {len(key)} characters; a key has at least {MIN_KEY_CHARS}"
    return None


def parse_keys(text: str, source: str, *, comments: bool = False) -> list[str]:
    """The keys in ``text`` (the value of ``source``, a variable or file): separated by ASCII
    whitespace or commas. With ``comments`` (key files), a word that starts with ``#`` begins
    a comment that runs to the end of its line; elsewhere ``#`` is a key character like any
    other. Raises ``ConfigError`` naming ``source`` and the key's position, never the key."""
    keys: list[str] = []
    for line in text.split("\n"):
        for word in filter(None, _SEPARATORS.split(line)):
            if comments and word.startswith("#"):
                break
            keys.append(word)
    for n, key in enumerate(keys, 1):
        problem = key_problem(key)
        if problem is not None:
            raise ConfigError(f"{source}: key {n} {problem} (make one with `openssl rand -hex 32`)")
    return keys


def _mac(key: bytes, payload: bytes) -> str:
    return hmac.new(key, payload, hashlib.sha256).hexdigest()


class Keyring:
    """A signing key (optional) and the keys whose signatures are accepted (the verify keys
    and the signing key). Without any key, records are neither signed nor judged."""

    __slots__ = ("_keys", "_signing")

    def __init__(self, signing_key: str | None = None, verify_keys: Iterable[str] = ()) -> None:
        """Raises ``ConfigError`` (without the key) for a key that ``key_problem`` rejects."""
        keys = [] if signing_key is None else [signing_key]
        keys += list(verify_keys)
        for key in keys:
            if key_problem(key) is not None:
                raise ConfigError(
                    f"a signing key is at least {MIN_KEY_CHARS} printable ASCII characters, "
                    "without spaces or commas"
                )
        self._keys = {key_id(k): k.encode() for k in keys}
        self._signing = None if signing_key is None else key_id(signing_key)

    def __repr__(self) -> str:
        return f"Keyring(signing={self._signing!r}, accepted={list(self.key_ids)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Keyring):
            return NotImplemented
        return (self._signing, self._keys) == (other._signing, other._keys)

    def __hash__(self) -> int:
        return hash((self._signing, self.key_ids))

    @property
    def signing_key_id(self) -> str | None:
        """The id of the key new records are signed with (None: this keyring cannot sign)."""
        return self._signing

    @property
    def key_ids(self) -> tuple[str, ...]:
        """The ids of the accepted keys, sorted."""
        return tuple(sorted(self._keys))

    @property
    def can_sign(self) -> bool:
        return self._signing is not None

    @property
    def requires_signature(self) -> bool:
        """True when any key is accepted: only validly signed records are used."""
        return bool(self._keys)

    def scrub(self, message: str) -> str:
        """``message`` with every key of this keyring masked (for messages built from
        foreign text, e.g. the CLI's error line)."""
        for key in self._keys.values():
            message = message.replace(key.decode(), MASK)
        return message

    # -- signing and judging ----------------------------------------------------------------
    def sign(self, plan: Plan) -> Plan:
        """``plan`` signed with the signing key (whatever signature it carried is replaced);
        ``ValueError`` without a signing key."""
        if self._signing is None:
            raise ConfigError("this keyring holds no signing key")
        mac = _mac(self._keys[self._signing], plan.payload())
        return plan.signed(Signature(self._signing, mac))

    def verdict(self, plan: Plan) -> SignatureVerdict:
        """What this keyring makes of ``plan``'s signature (``UNKNOWN_KEY`` for any
        signature when it holds no key)."""
        return self._verdict(plan.signature, plan.payload())

    def _verdict(self, sig: Signature | None, payload: bytes) -> SignatureVerdict:
        if sig is None:
            return SignatureVerdict.UNSIGNED
        key = self._keys.get(sig.keyid)
        if key is None:
            return SignatureVerdict.UNKNOWN_KEY
        if not hmac.compare_digest(_mac(key, payload), sig.hmac_sha256):
            return SignatureVerdict.BAD_MAC
        return SignatureVerdict.VALID

    def check(self, plan: Plan) -> Plan:
        """``plan``, if this keyring holds no key or ``plan`` is validly signed by an
        accepted one; else ``InvalidSignatureError`` saying why."""
        if self._keys:
            self._check(plan.signature, plan.payload())
        return plan

    def _check(self, sig: Signature | None, payload: bytes) -> None:
        if not self._keys:
            return
        verdict = self._verdict(sig, payload)
        if verdict is SignatureVerdict.VALID:
            return
        if sig is None:
            raise InvalidSignatureError("record is not signed")
        if verdict is SignatureVerdict.UNKNOWN_KEY:
            raise InvalidSignatureError(f"record is signed by key {sig.keyid}, not an accepted one")
        raise InvalidSignatureError(
            f"record's signature by key {sig.keyid} does not match its content "
            "(changed after signing)"
        )

    def sign_payload(self, payload: bytes) -> Signature:
        """The signature of ``payload`` (any canonical bytes, e.g. an artifact manifest) with
        the signing key; ``ValueError`` without one."""
        if self._signing is None:
            raise ConfigError("this keyring holds no signing key")
        return Signature(self._signing, _mac(self._keys[self._signing], payload))

    def verdict_payload(self, payload: bytes, sig: Signature | None) -> SignatureVerdict:
        """What this keyring makes of ``sig`` over ``payload`` (as ``verdict`` for a plan)."""
        return self._verdict(sig, payload)

    def check_foreign(self, data: bytes) -> None:
        """``InvalidSignatureError`` unless this keyring holds no key or ``data``, a record
        of another schema, is validly signed by an accepted key under the rule every schema
        keeps: a ``signature`` ``{"keyid", "hmac_sha256"}`` whose HMAC covers the canonical
        encoding (orjson, sorted keys) of the record without it."""
        if not self._keys:
            return
        try:
            record = orjson.loads(data)
            if not isinstance(record, dict):
                raise InvalidPlanError("a record is a JSON object")
            sig = Signature.from_dict(record.pop("signature")) if "signature" in record else None
            payload = orjson.dumps(record, option=orjson.OPT_SORT_KEYS)
        except (orjson.JSONDecodeError, orjson.JSONEncodeError, InvalidPlanError) as exc:
            raise InvalidSignatureError(f"record's signature cannot be checked: {exc}") from None
        self._check(sig, payload)

    # -- the writer's rules (see the module docstring) -------------------------------------
    def seal(self, plan: Plan) -> Plan:
        """``plan`` as a writer with this keyring writes it: signed with the signing key,
        else as it is (with the signature it carries, if any)."""
        return self.sign(plan) if self._signing is not None else plan

    def base(self, stored: Plan) -> Plan:
        """The stored record a write may build on: a signing keyring only builds on records
        that pass ``check`` (it never signs observations it did not verify); others build on
        any record. Raises ``InvalidSignatureError``."""
        return self.check(stored) if self._signing is not None else stored

    def settled(self, stored: Plan) -> bool:
        """True if ``stored`` is signed as this keyring would write it: no signing key, or
        signed with the signing key (else a write re-signs it)."""
        sig = stored.signature
        return self._signing is None or (sig is not None and sig.keyid == self._signing)

    def may_replace(self, stored: Plan, sealed: Plan) -> bool:
        """False where writing ``sealed`` over ``stored`` would downgrade a signed record: the
        stored one is signed and ``sealed`` is unsigned, or signed in a way this keyring
        does not accept (when it holds keys)."""
        if stored.signature is None:
            return True
        if sealed.signature is None:
            return False
        return not self._keys or self.verdict(sealed) is SignatureVerdict.VALID

    def displaces(self, foreign: bytes, sealed: Plan) -> bool:
        """True where writing ``sealed`` may replace ``foreign``, a record of another schema:
        ``sealed`` is validly signed by an accepted key and ``foreign`` is not
        (``check_foreign``), so it is as untrusted as an invalid record. Otherwise (no keys,
        or an unsigned write) another version's record is never overwritten."""
        if not self._keys or self.verdict(sealed) is not SignatureVerdict.VALID:
            return False
        try:
            self.check_foreign(foreign)
        except InvalidSignatureError:
            return True
        return False


NO_KEYS = Keyring()
"""The keyring of a store no keys were given to: records are written and read as they are."""
