"""Custom Triton kernels of the kind vLLM ships, called directly (outside ``torch.compile``),
for ``benchmarks.gpu_caches``: four ``@triton.jit`` functions, each launched in two
specialisations (a block size or a warp count), so eight kernels for Triton to compile.

Imported only where a CUDA GPU is present (Triton launches nothing without one).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

ELEMENTS = 1 << 16
"""Elements of each elementwise kernel's input."""


@triton.jit  # type: ignore[untyped-decorator]
def bench_add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


@triton.jit  # type: ignore[untyped-decorator]
def bench_silu_mul(g_ptr, u_ptr, out_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    g = tl.load(g_ptr + offsets, mask=mask).to(tl.float32)
    u = tl.load(u_ptr + offsets, mask=mask).to(tl.float32)
    out = g * tl.sigmoid(g) * u
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit  # type: ignore[untyped-decorator]
def bench_scale(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    tl.store(out_ptr + offsets, (x * factor).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit  # type: ignore[untyped-decorator]
def bench_rms_norm(x_ptr, w_ptr, out_ptr, cols, eps, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < cols
    x = tl.load(x_ptr + row * cols + offsets, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    rms = tl.rsqrt(tl.sum(x * x, axis=0) / cols + eps)
    tl.store(out_ptr + row * cols + offsets, (x * rms * w).to(out_ptr.dtype.element_ty), mask=mask)


NAMES = ("bench_add", "bench_silu_mul", "bench_scale", "bench_rms_norm")
"""The kernels' function names, as Triton's compilation listener reports them."""
LAUNCHES = 8
"""Distinct compiled kernels ``run_all`` asks Triton for."""


def run_all(dtype: torch.dtype, rows: int, cols: int, seed: int = 0) -> dict[str, Any]:
    """Launch every kernel in both of its specialisations on fixed inputs (seeded) and
    return each output by name; synchronises before returning."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(ELEMENTS, device="cuda", dtype=dtype, generator=gen)
    y = torch.randn(ELEMENTS, device="cuda", dtype=dtype, generator=gen)
    m = torch.randn(rows, cols, device="cuda", dtype=dtype, generator=gen)
    w = torch.randn(cols, device="cuda", dtype=dtype, generator=gen)
    outputs: dict[str, Any] = {}
    for block in (256, 1024):
        grid = (triton.cdiv(ELEMENTS, block),)
        out = torch.empty_like(x)
        bench_add[grid](x, y, out, ELEMENTS, BLOCK=block)
        outputs[f"bench_add_{block}"] = out
        out = torch.empty_like(x)
        bench_silu_mul[grid](x, y, out, ELEMENTS, BLOCK=block)
        outputs[f"bench_silu_mul_{block}"] = out
        out = torch.empty_like(x)
        bench_scale[grid](x, out, ELEMENTS, 0.5, BLOCK=block)
        outputs[f"bench_scale_{block}"] = out
    block = triton.next_power_of_2(cols)
    for warps in (4, 8):
        out = torch.empty_like(m)
        bench_rms_norm[(rows,)](m, w, out, cols, 1e-6, BLOCK=block, num_warps=warps)
        outputs[f"bench_rms_norm_w{warps}"] = out
    torch.cuda.synchronize()
    return outputs
