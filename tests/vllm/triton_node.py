"""One "node" of Triton's cache: a fresh process that fetches the shared Triton cache as the
plugin does (``caches.start_fetch``), compiles real Triton kernels for a CUDA target (sm_90:
Triton 3.9 compiles for it without a GPU, ptxas included), calls ``caches.ready`` as a
``Worker`` does after its warm-up, waits for the upload, and prints one JSON line.

The kernels: Triton's tutorial matmul in ``CONFIGS`` tile shapes (what an autotuned kernel
compiles). A kernel counts as compiled where this process wrote its cache directory (a
kernel found in the cache, the node's own or fetched, writes nothing).

usage: triton_node.py [--kernels N]; run with ``TRITON_CACHE_DIR``, ``PLANCACHE_URL`` and
``VLLM_CACHE_ROOT`` set, the checkout's root on the path.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

START = time.perf_counter()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from tests.vllm.last_line import say  # noqa: E402

CONFIGS = [(bm, bn, bk) for bm in (64, 128) for bn in (64, 128) for bk in (32, 64)]
TARGET = GPUTarget("cuda", 90, 32)


@triton.jit  # type: ignore[untyped-decorator]
def matmul(  # type: ignore[no-untyped-def]
    a,
    b,
    c,
    m,
    n,
    k,
    sam,
    sak,
    sbk,
    sbn,
    scm,
    scn,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for start in range(0, k, BK):
        x = tl.load(a + rm[:, None] * sam + (start + rk)[None, :] * sak)
        y = tl.load(b + (start + rk)[:, None] * sbk + rn[None, :] * sbn)
        acc += tl.dot(x, y)
    tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(tl.float16))


def kernel_dirs(root: Path) -> set[str]:
    try:
        return {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")}
    except FileNotFoundError:
        return set()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=int, default=len(CONFIGS))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")  # plancache's lines
    from plancache.integrations.vllm import caches, compile

    root = Path(os.environ["TRITON_CACHE_DIR"])
    fetch_start = time.perf_counter()
    job = caches.start_fetch()
    if job is not None:
        job.join(120)
    fetched_s = time.perf_counter() - fetch_start
    before = kernel_dirs(root)
    signature = {n: "*fp16" for n in ("a", "b", "c")} | {
        n: "i32" for n in ("m", "n", "k", "sam", "sak", "sbk", "sbn", "scm", "scn")
    }
    compile_start = time.perf_counter()
    for bm, bn, bk in CONFIGS[: args.kernels]:
        source = triton.compiler.ASTSource(
            fn=matmul, signature=signature, constexprs={"BM": bm, "BN": bn, "BK": bk}
        )
        triton.compile(source, target=TARGET)
    compile_s = time.perf_counter() - compile_start
    compiled = len(kernel_dirs(root) - before)
    upload_start = time.perf_counter()
    uploaded = caches.ready()
    if uploaded is not None:
        compile.uploads.wait(120)
    report = {
        "kernels": args.kernels,
        "compiled": compiled,
        "fetch_s": fetched_s,
        "compile_s": compile_s,
        "upload_s": time.perf_counter() - upload_start,
        "process_s": time.perf_counter() - START,
    }
    say(report)


if __name__ == "__main__":
    main()
