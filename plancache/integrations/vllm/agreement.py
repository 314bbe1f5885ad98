"""The rank agreement: every rank of vLLM's world group votes exactly once, at the same point
of the boot (``determine_available_memory``), so that all ranks take the same path: a rank
that profiles while another applies waits forever in the dummy runs' collectives (vLLM
defect 3), and with data parallelism the world group spans every DP engine.

There is no timeout of our own: the vote waits as long as vLLM's own collectives on that
group would (its process-group timeout, 30 min by default). If the vote fails, the group
holds a pending operation that would pair with vLLM's next collective, so the boot fails
with ``RankAgreementError``, as vLLM's own collectives would. Imports torch only when called.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass
from datetime import timedelta

from plancache.errors import RankAgreementError


class Vote(enum.IntEnum):
    """What a rank can do; the index of its count in the all-reduced tensor."""

    EXPLICIT = 0
    """Skips profiling with a value it was given (``kv_cache_memory_bytes`` set)."""
    APPLY = 1
    """Can skip profiling with a plan."""
    PROFILE = 2
    """Must profile (no applicable plan)."""


@dataclass(frozen=True)
class Tally:
    """The votes of every rank of the group."""

    explicit: int
    apply: int
    profile: int

    @property
    def size(self) -> int:
        return self.explicit + self.apply + self.profile

    @property
    def all_skip(self) -> bool:
        """True if no rank must profile: every rank applies its plan or an explicit value."""
        return self.profile == 0

    @property
    def inconsistent(self) -> bool:
        """Explicit on some ranks, no applicable plan on others: the ranks cannot all take
        the same path."""
        return self.explicit > 0 and self.profile > 0

    def describe(self) -> str:
        return (
            f"{self.size} ranks: {self.apply} can apply a plan, {self.explicit} explicit, "
            f"{self.profile} must profile"
        )


def _world_group() -> object | None:
    """vLLM's world ``GroupCoordinator`` when vLLM set one up, else None."""
    parallel_state = sys.modules.get("vllm.distributed.parallel_state")
    if parallel_state is None:
        return None
    try:
        group: object = parallel_state.get_world_group()
    except Exception:  # not initialized
        return None
    return group


def group_timeout(coordinator: object | None, group: object | None) -> timedelta | None:
    """How long collectives on ``group`` wait: vLLM's ``cpu_timeout`` if set, else the gloo
    backend's own, else torch's default; None if none can be read."""
    timeout = getattr(coordinator, "cpu_timeout", None)
    if isinstance(timeout, timedelta):
        return timeout
    try:
        import torch

        backend = group._get_backend(torch.device("cpu"))  # type: ignore[union-attr]
        own = backend.options._timeout
        if isinstance(own, timedelta):
            return own
    except Exception:
        pass
    try:
        from torch.distributed.constants import default_pg_timeout
    except Exception:
        return None
    return default_pg_timeout if isinstance(default_pg_timeout, timedelta) else None


def agree(vote: Vote) -> Tally:
    """All-reduce every rank's vote over vLLM's CPU world group (torch's default group before
    vLLM set one up); a group of one, or no torch.distributed: this rank's vote alone.
    Waits as long as the group's own collectives; raises ``RankAgreementError`` if the vote
    fails."""
    counts = [0, 0, 0]
    counts[vote] = 1
    alone = Tally(*counts)
    if "torch.distributed" not in sys.modules:  # never imported: no process group exists
        return alone
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return alone
    if not (dist.is_available() and dist.is_initialized()):
        return alone
    coordinator = _world_group()
    group = getattr(coordinator, "cpu_group", None)
    try:
        size = dist.get_world_size(group)
    except Exception as exc:
        raise RankAgreementError(f"plancache: rank agreement: no process group: {exc}") from exc
    if size <= 1:
        return alone
    flags = torch.tensor(counts, dtype=torch.int64)
    try:
        dist.all_reduce(flags, op=dist.ReduceOp.SUM, group=group)
    except Exception as exc:
        timeout = group_timeout(coordinator, group)
        raise RankAgreementError(
            f"plancache: the {size} ranks could not agree on the KV-cache plan "
            f"(process-group timeout {timeout}): {type(exc).__name__}: {exc}. The group now "
            "holds a pending collective, so this boot stops here; check that every rank "
            "(every node and DP engine) runs with plancache enabled identically and that "
            "all of them reach determine_available_memory"
        ) from exc
    explicit, apply, profile = (int(v) for v in flags.tolist())
    return Tally(explicit, apply, profile)
