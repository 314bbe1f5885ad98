"""One process of a Triton program that shares its cache through
``TRITON_CACHE_MANAGER=plancache.integrations.triton:CacheManager`` (set by the caller, with
``TRITON_CACHE_DIR`` and ``PLANCACHE_URL``): compiles real Triton kernels for a CUDA target
(sm_90; Triton 3.9 compiles for it without a GPU), counts what Triton compiled and what it
found in its cache with Triton's own compilation listener (``knobs.compilation.listener``,
``cache_hit``), prints one JSON line and exits (the manager pushes at exit). It imports torch
first, as a program that launches Triton kernels on tensors does (plancache names the GPU
through torch: ``plancache.caches.device``).

The kernels: Triton's tutorial matmul in ``triton_node.CONFIGS`` tile shapes.

usage: triton_manager_node.py [--kernels N] [--push-then-die]; the checkout's root on the
path.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import time
from typing import Any

START = time.perf_counter()

import torch  # noqa: E402, F401  # as a Triton program that launches on tensors has
import triton  # noqa: E402
from triton import knobs  # noqa: E402

from tests.vllm.last_line import say  # noqa: E402
from tests.vllm.triton_node import CONFIGS, TARGET, matmul  # noqa: E402

SIGNATURE = {n: "*fp16" for n in ("a", "b", "c")} | {
    n: "i32" for n in ("m", "n", "k", "sam", "sak", "sbk", "sbn", "scm", "scn")
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=int, default=4)
    ap.add_argument(
        "--push-then-die",
        action="store_true",
        help="push now (plancache.integrations.triton.push), then end without exit handlers",
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    counts = {"compiled": 0, "hits": 0}

    def listener(*, cache_hit: bool, **_: Any) -> None:
        counts["hits" if cache_hit else "compiled"] += 1

    knobs.compilation.listener = listener
    cubins = []
    compile_start = time.perf_counter()
    for bm, bn, bk in CONFIGS[: args.kernels]:
        source = triton.compiler.ASTSource(
            fn=matmul, signature=SIGNATURE, constexprs={"BM": bm, "BN": bn, "BK": bk}
        )
        kernel = triton.compile(source, target=TARGET)
        cubins.append(hashlib.sha256(kernel.asm["cubin"]).hexdigest())
    report = {
        "kernels": args.kernels,
        "manager": os.environ.get("TRITON_CACHE_MANAGER", ""),
        "compiled": counts["compiled"],
        "hits": counts["hits"],
        "cubins": cubins,
        "compile_s": time.perf_counter() - compile_start,
        "process_s": time.perf_counter() - START,
    }
    if args.push_then_die:
        from plancache.integrations import triton as shared

        report["pushed"] = [p.files for p in shared.push(60)]
    report["said_at"] = time.time()  # the test measures the exit from here
    say(report)
    if args.push_then_die:
        os._exit(0)  # as a process killed by a signal: no atexit handler runs


if __name__ == "__main__":
    main()
