"""One boot of a node, as the vLLM plugin runs it, in a fresh process (for test_breaker).

``python -m tests.breaker_node boot``: recover crash marks, look up, and when the lookup hits,
arm a mark, "warm up" and disarm it; ``... die``: the same, but after arming, print and wait
to be killed (a boot that dies with the plan applied). Prints the decision as one JSON line.
Settings come from the ``PLANCACHE_*`` variables.
"""

from __future__ import annotations

import json
import sys
import time

from plancache import PlanCache, fingerprint
from plancache.breaker import Breaker
from plancache.config import Settings
from plancache.testing import FACTORS, GiB


def main(mode: str) -> None:
    settings = Settings.from_env()
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
