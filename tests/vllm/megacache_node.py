"""One process of a plain PyTorch program (CPU) using torch's mega-cache through
``plancache.integrations.torch``: ``save`` compiles a small function with ``torch.compile``
and saves the mega-cache; ``load`` loads it first, then compiles the same function. Prints
one JSON line: the output, Inductor's FX-graph cache counters
(``torch._dynamo.utils.counters["inductor"]``) and what plancache did.

usage: megacache_node.py {save,load,load-save} NAME (``load-save``: load, compile, save);
run with ``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR`` and ``PLANCACHE_URL`` set, the
checkout's root on the path.
"""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

import torch
from torch._dynamo.utils import counters

from plancache.integrations import torch as mega
from tests.vllm.last_line import say


def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x @ y + 1.0).sum(dim=0) * torch.sin(x[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["save", "load", "load-save"])
    ap.add_argument("name")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    report: dict[str, Any] = {"mode": args.mode}
    if args.mode.startswith("load"):
        loaded = mega.load(args.name)
        report |= {"reason": loaded.reason, "loaded": loaded.loaded, "failed": loaded.failed}
        report["load_s"] = loaded.seconds
    x = torch.arange(64, dtype=torch.float32).reshape(8, 8) / 64
    y = torch.linspace(-1, 1, 64).reshape(8, 8)
    start = time.perf_counter()
    out = torch.compile(f)(x, y)
    report["compile_s"] = time.perf_counter() - start
    report["output"] = out.tolist()
    report["eager"] = f(x, y).tolist()
    inductor = counters["inductor"]
    report["fxgraph_hit"] = inductor["fxgraph_cache_hit"]
    report["fxgraph_miss"] = inductor["fxgraph_cache_miss"]
    report["autograd_hit"] = counters["aot_autograd"]["autograd_cache_hit"]
    if args.mode.endswith("save"):
        saved = mega.save(args.name)
        report |= {"bytes": saved.bytes, "written": saved.written, "skipped": saved.skipped}
        report["loaded_left_out"] = saved.loaded
    say(report)


if __name__ == "__main__":
    main()
