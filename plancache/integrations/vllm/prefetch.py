"""The compile artifact's fetch, started when a ``support_torch_compile`` model is built, so
that it overlaps the weights' loading.

``wrap_decorator`` wraps vLLM's ``_support_torch_compile``: each class it makes calls a
``start`` hook once an instance is built (the plugin's starts a ``Prefetch``). A
``Prefetch`` computes the artifact's path as vLLM will at the first forward (``aot_path``)
and runs the fetch in a daemon thread, within one bound from its start. Guarantees: nothing
raises into vLLM (failures are logged, the node compiles); no reference to the model is kept
past its key; the first forward waits for the fetch only as ``join_fetch`` says, and a fetch
it stopped waiting for installs nothing.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plancache import _background as background
from plancache._artifacts.engine import Fetched
from plancache._artifacts.pacing import join_fetch
from plancache._background import Job
from plancache.integrations.vllm.apply import safely
from plancache.integrations.vllm.compiling import aot_path

MARK = "__plancache_wrapped__"

Prepare = Callable[
    [Path, str, str, bool, float, Callable[[], bool], threading.Event], Fetched | None
]
"""What a prefetch runs: (vLLM's ``<key>`` directory, key, rank, prefetched, deadline,
cancelled, streaming) to what it fetched (``compile._prepare``)."""


class Prefetch:
    """A fetch started when a ``support_torch_compile`` model was built, in a daemon thread:
    it computes the artifact's path as vLLM will at the first forward, then ``prepare``,
    all within ``bound`` seconds from now."""

    def __init__(self, model: Any, prepare: Prepare, bound: float) -> None:
        self.model, self.prepare = model, prepare
        self.where: tuple[Path, str] | None = None
        self.fetched: Fetched | None = None
        self.started = time.monotonic()
        self.deadline = self.started + bound  # one bound, in all
        self.cancelled = threading.Event()
        self.streaming = threading.Event()
        self.job: Job[object] = background.start(self._run, "plancache-compile-fetch")

    def _run(self) -> None:
        self.where = safely(aot_path, self.model)
        self.model = None  # no reference kept past the key
        if self.where is not None:
            root, rank = self.where
            self.fetched = safely(
                self.prepare,
                root,
                root.name,
                rank,
                True,
                self.deadline,
                self.cancelled.is_set,
                self.streaming,
            )

    def done(self) -> bool:
        """True once the prefetch ended (fetched, missed, failed or cancelled)."""
        return self.job.done()

    def join(self) -> tuple[Path, str] | None:
        """Wait for the prefetch (``join_fetch``: until its deadline, the fetch bound from
        its start with the store's opening included, once it streams; else ``JOIN_S``, and
        at least ``FIRST_ANSWER_S`` from its start);
        where it fetched for, or None if it computed no path or is still running: then it
        is cancelled, and installs nothing after this."""
        if join_fetch(self.job, self.deadline, self.streaming, self.cancelled, self.started):
            return self.where
        return None


def wrap_decorator(
    original: Callable[..., Any], start: Callable[[Any], None]
) -> Callable[..., Any]:
    """vLLM's ``_support_torch_compile``, whose classes call ``start(self)`` once built."""

    @functools.wraps(original)
    def support(cls: type, *args: Any, **kwargs: Any) -> type:
        out: type = original(cls, *args, **kwargs)
        init = vars(out).get("__init__")  # set on the class by the decorator
        if callable(init) and not getattr(init, MARK, False):

            @functools.wraps(init)
            def __init__(self: Any, *a: Any, **kw: Any) -> None:
                init(self, *a, **kw)
                start(self)

            setattr(__init__, MARK, True)
            out.__init__ = __init__  # type: ignore[misc]
        return out

    setattr(support, MARK, True)
    return support
