"""The rank agreement: a plan is applied only if every rank of the worker group can apply its
own (vLLM defect 3: a rank that profiles while another applies waits forever in collectives).

Imports torch only when called.
"""

from __future__ import annotations

import sys
from datetime import timedelta

RANK_AGREEMENT_TIMEOUT_S = 300.0
"""Longest wait for the other ranks to reach the agreement; past it this rank profiles."""


def _agreement_group() -> object | None:
    """vLLM's CPU (gloo) world group when vLLM set one up, else None (torch's default)."""
    parallel_state = sys.modules.get("vllm.distributed.parallel_state")
    if parallel_state is not None:
        try:
            group: object = parallel_state.get_world_group().cpu_group
            return group
        except Exception:
            pass
    return None


def agree(can_apply: bool) -> tuple[bool, str]:
    """(every rank can apply, note for the log). Without torch.distributed, or alone in the
    group: this rank's own answer. A failed or timed-out agreement: False."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return can_apply, ""
    if not (dist.is_available() and dist.is_initialized()):
        return can_apply, ""
    try:
        group = _agreement_group()
        size = dist.get_world_size(group)
        if size <= 1:
            return can_apply, ""
        flag = torch.tensor([1 if can_apply else 0], dtype=torch.int32)
        work = dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group, async_op=True)
        work.wait(timeout=timedelta(seconds=RANK_AGREEMENT_TIMEOUT_S))
        agreed = bool(flag.item())
    except Exception as exc:
        return False, f"; rank agreement failed ({type(exc).__name__}: {exc})"
    return agreed, f"; {size} ranks agreed" if agreed else f"; not all {size} ranks can apply"
