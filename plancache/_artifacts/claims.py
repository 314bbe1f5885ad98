"""Upload claims: at most one node of a fleet uploads an object at a time.

A claim is the object ``<name>.claim`` on the same object layer, holding its holder and its
expiry; it is created if absent, or taken over once expired by a compare-and-swap on the
version read. Guarantees: two nodes never both hold a live claim on one name (where the
store honours conditional writes); a node that dies while uploading blocks the others only
until its claim expires (``CLAIM_BASE_S`` plus the object's size at ``CLAIM_BYTES_PER_S``).
"""

from __future__ import annotations

import os
import socket
import time

import orjson

from plancache._objects import ObjectLayer, Update

CLAIM_SUFFIX = ".claim"
CLAIM_BASE_S = 120.0
CLAIM_BYTES_PER_S = float(1 << 20)
"""A claim lasts ``CLAIM_BASE_S`` plus the object's size at this rate (a slow uplink)."""


def claim(layer: ObjectLayer, name: str, size: int, now: float | None = None) -> object | None:
    """Claim the upload of ``name`` on ``layer``: the object ``<name>.claim`` created, or
    taken over once expired (compare-and-swap on the version read), holding its expiry. The
    claim's version, or None where another node holds a live claim. A node that dies while
    uploading blocks the others only until its claim expires."""
    now = time.time() if now is None else now
    body = orjson.dumps(
        {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "until": now + CLAIM_BASE_S + size / CLAIM_BYTES_PER_S,
        }
    )
    claimed = name + CLAIM_SUFFIX
    for _ in range(2):  # create; else take over an expired claim (once)
        if layer.write_object(claimed, [body]):
            found = layer.read_object(claimed, 4096)
            return None if found is None or found[0] != body else found[1]
        found = layer.read_object(claimed, 4096)
        if found is None:
            continue  # released meanwhile: try to create it again
        try:
            until = float(orjson.loads(found[0])["until"])
        except (ValueError, KeyError, TypeError):
            until = 0.0  # not a claim this reads: expired
        if until > now:
            return None
        if layer.write_object(claimed, [body], Update(found[1])):
            taken = layer.read_object(claimed, 4096)
            return None if taken is None or taken[0] != body else taken[1]
        return None
    return None
