"""One boot of a node, as the vLLM plugin runs it, in a fresh process (for test_breaker).

``python -m tests.breaker_node boot``: recover crash marks, look up, and when the lookup hits,
arm a mark, "warm up" and disarm it; ``... die``: the same, but after arming, print and wait
to be killed (a boot that dies with the plan applied). Prints the decision as one JSON line.
Settings come from the ``PLANCACHE_*`` variables.
"""

from __future__ import annotations

import importlib
import json
import sys
import time

from plancache import PlanCache, fingerprint
from plancache._breaker import Breaker
from plancache._config import Settings
from plancache.testing import FACTORS, GiB

CLIENTS = {"s3": "s3fs", "gs": "gcsfs"}
"""The client library each remote scheme's store imports when it opens (within the 5 s that a
use waits for a store to open): imported first, so that a loaded test machine does not make a
boot here find its store unopened, where the plugin would have opened it during the load."""


def main(mode: str) -> None:
    settings = Settings.from_env()
    scheme = settings.url.partition("://")[0]
    if scheme in CLIENTS:
        importlib.import_module(CLIENTS[scheme])
    cache = PlanCache(settings.open_store, timeout=20.0)
    breaker = Breaker.from_settings(settings)
    fp = fingerprint(FACTORS)
    avoid = breaker.recover(cache, fp)
    d = cache.lookup(FACTORS, 80 * GiB, avoid=avoid)
    mark = breaker.arm(fp, d.observation) if d.observation is not None else None
    print(json.dumps({"reason": d.reason, "kv": d.kv_cache_memory_bytes}), flush=True)
    if mark is not None and mode == "die":
        time.sleep(120)  # killed here: inside the warm-up, with the plan applied
    breaker.disarm(mark)


if __name__ == "__main__":
    main(sys.argv[1])
