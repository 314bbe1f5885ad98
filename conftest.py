"""Loose time bounds for every test under ``tests/`` and ``benchmarks/``.

Beside three test workers on two cores, the servers the tests start, and a client opened cold
(its SDK imported, its TLS context built), sometimes take longer than the library's default
bounds: 3 s per remote call (``CallTimeouts``), 5 s for a use to wait for a client to open
(``LazyStore``) and a 2 s lookup or record budget (``PlanCache``, ``PLANCACHE_TIMEOUT``). A
test that does not set its own bounds therefore gets loose defaults (``tests/helpers.py``), so
that it fails on what it checks, never on the machine's load. A test that checks the
library's defaults, or what happens when they run out, is marked ``default_bounds`` and keeps
them. Child processes are not reached from here: tests give the remote stores they configure
``LOOSE_OPTIONS``, and a PlanCache budget of their own.
"""

from __future__ import annotations

from dataclasses import astuple

import pytest

import plancache._config
from plancache._backends._remote import CallTimeouts
from plancache._backends.lazy import LazyStore
from plancache._cache import PlanCache
from tests.helpers import LOOSE_BOUNDS, LOOSE_BUDGET_S


@pytest.fixture(autouse=True)
def _loose_default_bounds(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("default_bounds") is None:
        monkeypatch.setattr(CallTimeouts.__init__, "__defaults__", astuple(LOOSE_BOUNDS))
        monkeypatch.setattr(PlanCache.__init__, "__defaults__", (LOOSE_BUDGET_S,))
        monkeypatch.setattr(LazyStore.__init__, "__kwdefaults__", {"open_timeout": LOOSE_BUDGET_S})
        monkeypatch.setattr(plancache._config, "DEFAULT_BUDGET_S", LOOSE_BUDGET_S)
