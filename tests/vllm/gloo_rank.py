"""One rank of the rank-agreement tests: boots a stand-in worker in a gloo process group and
prints what happened as one JSON line.

usage: gloo_rank.py RANK WORLD_SIZE INIT_FILE FREE_MEMORY_BYTES GROUP_TIMEOUT_S [idle|explicit]

``explicit``: boot with ``kv_cache_memory_bytes`` set (7 GiB). ``idle``: join the group
but never boot (a peer that does not reach the agreement). After the boot, each rank
all-reduces ``rank + 1`` and reports the sum: a pending collective would pair with it;
``marked``: whether the rank held a crash mark between the decision and the warm-up.
The checkout's root must be on ``PYTHONPATH``.

Every way out ends with ``_exit``, once the plugin's background writes are done: gloo's
worker threads release a finished collective's tensors on their own time, and a tensor
released while the interpreter finalizes takes the GIL there, which ends that thread with
a forced unwind through a ``noexcept`` destructor: ``std::terminate``, SIGABRT
("terminate called without an active exception"), about once in 50 boots on a loaded
machine. ``destroy_process_group`` does not wait for those threads.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

import plancache.integrations.vllm as plugin
from plancache.errors import RankAgreementError
from plancache.integrations.vllm.save import wait_saved
from tests.vllm.last_line import say
from tests.vllm.support import load_standin, use_fake_runtime


def exit_now(report: dict[str, object], worker: object = None) -> NoReturn:
    """Print ``report`` as the last line, wait (10 s at most) for ``worker``'s background
    store writes, and end the process without finalizing the interpreter."""
    say(report)
    if worker is not None:
        wait_saved(worker, 10.0)
    sys.stderr.flush()
    os._exit(0)


def main(argv: list[str]) -> None:
    rank, world, init_file = int(argv[1]), int(argv[2]), argv[3]
    free, timeout = int(argv[4]), float(argv[5])
    idle, explicit = "idle" in argv[6:], "explicit" in argv[6:]
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout),
    )
    if idle:
        time.sleep(2 * timeout)
        exit_now({"rank": rank, "idle": True})
    use_fake_runtime()
    module = load_standin()
    plugin.patch_worker_module(module)
    kv_bytes = 7 * (1 << 30) if explicit else None
    worker = module.Worker(
        rank=rank, world_size=world, free_memory=free, kv_cache_memory_bytes=kv_bytes
    )
    start = time.perf_counter()
    try:
        worker.load_model()
        kv = worker.determine_available_memory()
        boot = plugin.boot_of(worker)
        marked = boot is not None and boot.mark is not None  # held while a plan is applied
        worker.compile_or_warm_up_model()
    except RankAgreementError as exc:
        exit_now({"rank": rank, "error": str(exc), "seconds": time.perf_counter() - start}, worker)
    seconds = time.perf_counter() - start
    total = torch.tensor([rank + 1])
    dist.all_reduce(total)
    report = {"rank": rank, "kv": kv, "events": worker.events, "seconds": seconds, "marked": marked}
    dist.destroy_process_group()
    exit_now({**report, "next_collective": int(total.item())}, worker)


if __name__ == "__main__":
    main(sys.argv)
