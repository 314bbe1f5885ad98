"""A plain PyTorch program, as a user runs it: a small MLP, one forward and backward under
``torch.compile``, on the CPU. It prints one JSON line: the first call's seconds, wall
and CPU (where Inductor compiles, or finds its caches), torch's own cache counters, and the loss and
gradients (as ``float.hex``: equal means bit for bit). ``--mega-load NAME`` loads torch's
mega-cache through ``plancache.integrations.torch`` before compiling; ``--mega-save NAME``
saves it after the first call (off the measured time). Run by ``benchmarks.torch_run``."""

from __future__ import annotations

import argparse
import json
import resource
import time

START = time.perf_counter()

import torch  # noqa: E402  (the import is part of what a process costs)
from torch._dynamo.utils import counters  # noqa: E402

WIDTH = 512
COUNTERS = {
    "inductor": ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass"),
    "aot_autograd": ("autograd_cache_hit", "autograd_cache_miss", "autograd_cache_bypass"),
}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, WIDTH),
        torch.nn.GELU(),
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.LayerNorm(WIDTH),
        torch.nn.GELU(),
        torch.nn.Linear(WIDTH, 10),
    )


def _cpu() -> float:
    """CPU seconds of this process and of its children that ended (Inductor's compiler)."""
    me, children = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mega-load", metavar="NAME")
    parser.add_argument("--mega-save", metavar="NAME")
    args = parser.parse_args()
    out: dict[str, object] = {"import_s": time.perf_counter() - START}
    if args.mega_load:
        from plancache.integrations import torch as mega

        loaded = mega.load(args.mega_load)
        out["mega_load"] = {"reason": loaded.reason, "loaded": loaded.loaded}
    model = _model()
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    compiled = torch.compile(model)
    start, cpu = time.perf_counter(), _cpu()
    loss = compiled(x).square().mean()
    loss.backward()
    out["first_call_s"] = time.perf_counter() - start
    out["first_call_cpu_s"] = _cpu() - cpu
    out["process_to_first_call_s"] = time.perf_counter() - START
    out["loss"] = loss.item().hex()
    out["grads"] = [p.grad.double().sum().item().hex() for p in model.parameters()]
    out["counters"] = {k: counters[group][k] for group, keys in COUNTERS.items() for k in keys}
    if args.mega_save:
        from plancache.integrations import torch as mega

        mega.save(args.mega_save)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
