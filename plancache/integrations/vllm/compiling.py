"""Whether a boot compiles during its profile run: vLLM's AOT artifact path computed as vLLM
computes it, the prediction made before the profile run (``boot_compiles``) and vLLM's own
compile counters read around it (``compile_count``). Never imported before vLLM is: every
vLLM import is inside a function.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from pathlib import Path
from typing import Any

from plancache._artifacts.manifest import check_rank
from plancache._keys import SCALAR_TYPES, Scalar

log = logging.getLogger("plancache.vllm")

PREFETCH_ATTR = "_plancache_compile_prefetch"
"""The attribute of a built model that holds its prefetch (``prefetch.Prefetch``: ``done()``
says whether it ended)."""


def aot_path(model: Any) -> tuple[Path, str] | None:
    """(vLLM's ``<key>`` directory, ``rank_<r>_<dp>``) of ``model``, computed as vLLM's
    ``support_torch_compile.__call__`` does (vllm 0.33 decorators.py ~l.560-585); None where
    vLLM will not load an AOT artifact."""
    import vllm.envs as envs
    from vllm.compilation import decorators
    from vllm.compilation.caching import aot_compile_hash_factors

    allowed = getattr(model, "_allow_aot_compile", True)  # vLLM 0.31 and 0.32 have no flag
    if model.do_not_compile or not (allowed and envs.VLLM_USE_AOT_COMPILE):
        return None
    if envs.VLLM_DISABLE_COMPILE_CACHE:
        return None
    factors: list[str] = aot_compile_hash_factors(model.vllm_config)
    factors.append(decorators._model_hash_key(model.forward))
    key = hashlib.sha256(str(factors).encode()).hexdigest()
    root = Path(envs.VLLM_CACHE_ROOT, "torch_compile_cache", "torch_aot_compile", key)
    parallel = model.vllm_config.parallel_config
    return root, check_rank(f"rank_{parallel.rank}_{parallel.data_parallel_index}")


CONFIG_FIELDS = ("model", "revision", "dtype", "max_model_len", "quantization", "seed")
"""Fields of vLLM's model config named in a compile miss: ``compute_hash`` covers them (and
more: a hash that differs while none of them does is named ``config_hash``)."""


def aot_factors(model: Any) -> dict[str, Scalar]:
    """What ``model``'s AOT key (``aot_path``) is made of, as flat scalars to diff: every
    variable of vLLM's ``envs.compile_factors()`` (``env.<NAME>``, lists and objects as
    JSON text), the config's hash and ``CONFIG_FIELDS`` (``config.<field>``), one hash of
    Inductor's factors (system, torch, configs), the forward's hash and vLLM's version."""
    import vllm
    import vllm.envs as envs
    from vllm.compilation import decorators
    from vllm.compilation.caching import aot_compile_hash_factors

    config = model.vllm_config
    parts = aot_compile_hash_factors(config)
    out: dict[str, Scalar] = {"vllm": vllm.__version__, "config_hash": str(parts[1])}
    for name, value in envs.compile_factors().items():
        out[f"env.{name}"] = _scalar(value)
    model_config = getattr(config, "model_config", None)
    for name in CONFIG_FIELDS:
        out[f"config.{name}"] = _scalar(getattr(model_config, name, None))
    out["inductor_hash"] = hashlib.sha256(str(parts[2:]).encode()).hexdigest()
    out["forward_hash"] = decorators._model_hash_key(model.forward)
    return out


def _scalar(value: object) -> Scalar:
    """``value`` if it is a scalar a plan's factors may hold, a list or object as JSON text,
    anything else (a ``torch.dtype``) as ``str``."""
    if type(value) in SCALAR_TYPES and not (type(value) is float and not math.isfinite(value)):
        return value  # type: ignore[return-value]
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def compiles(model: Any) -> bool | None:
    """Whether vLLM compiles the ``support_torch_compile`` module ``model`` at its first
    forward: False if it does not compile it or will load its AOT artifact (present now),
    True if no artifact is there to load (or vLLM keeps none: it compiles on every boot),
    None while its prefetch still runs or where ``model`` is not such a module."""
    do_not_compile = getattr(model, "do_not_compile", None)
    if do_not_compile is True:
        return False
    if do_not_compile is not False:
        return None
    prefetch = getattr(model, PREFETCH_ATTR, None)
    if prefetch is not None and not prefetch.done():
        return None
    where = aot_path(model)
    if where is None:
        return True
    root, rank = where
    return not (root / rank / "model").exists()


def boot_compiles(worker: Any) -> bool | None:
    """Whether ``worker``'s profiling run will compile (``compiles`` of every compiled
    module of its model): True if one will, False if none will, None if not known (a worker
    or vLLM without these parts, or a path that cannot be computed). Never raises."""
    try:
        import torch

        model = worker.model_runner.get_model()
        modules = model.modules() if isinstance(model, torch.nn.Module) else [model]
        answers = [compiles(m) for m in modules if hasattr(m, "do_not_compile")]
    except Exception as exc:  # doubt: provisional plans are not applied
        log.debug("plancache: whether this boot compiles is not known: %r", exc)
        return None
    if True in answers:
        return True
    return False if answers and None not in answers else None


def compile_count() -> int | None:
    """How many compiles vLLM's counters have seen in this process (backend compilations and
    AOT compiles; an AOT artifact loaded adds none); None where vLLM has no such counters."""
    try:
        from vllm.compilation.counter import compilation_counter as counter
    except ImportError:
        return None
    seen = (
        getattr(counter, name, None) for name in ("num_backend_compilations", "num_aot_compiles")
    )
    counts = [n for n in seen if type(n) is int]
    return sum(counts) if counts else None
