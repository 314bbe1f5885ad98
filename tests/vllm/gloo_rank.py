"""One rank of the rank-agreement tests: boots a stand-in worker in a gloo process group and
prints what happened as one JSON line.

usage: gloo_rank.py RANK WORLD_SIZE INIT_FILE FREE_MEMORY_BYTES AGREEMENT_TIMEOUT_S [idle]

``idle``: join the group but never boot (a peer that does not reach the agreement).
The checkout's root must be on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta

import torch.distributed as dist

import plancache.integrations.vllm as plugin
from plancache.integrations.vllm import agreement
from tests.vllm.support import load_standin, use_fake_runtime


def main(argv: list[str]) -> None:
    rank, world, init_file = int(argv[1]), int(argv[2]), argv[3]
    free, timeout = int(argv[4]), float(argv[5])
    idle = argv[6:] == ["idle"]
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    if idle:
        time.sleep(2 * timeout)
        print(json.dumps({"rank": rank, "idle": True}), flush=True)
        return
    use_fake_runtime()
    agreement.RANK_AGREEMENT_TIMEOUT_S = timeout
    module = load_standin()
    plugin.patch_worker_module(module)
    worker = module.Worker(rank=rank, world_size=world, free_memory=free)
    start = time.perf_counter()
    kv = worker.boot()
    seconds = time.perf_counter() - start
    print(json.dumps({"rank": rank, "kv": kv, "events": worker.events, "seconds": seconds}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv)
