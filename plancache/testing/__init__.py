"""The test kit plancache ships: plan helpers, child-process environments, the store
contract suite and loopback servers (install with ``pip install 'plancache[test]'``).

Nothing in ``plancache`` itself imports this package.
"""

from __future__ import annotations

from plancache.testing.env import PACKAGE_ROOT, SETTINGS_VARS, child_env
from plancache.testing.plans import FACTORS, GiB, make_plan

__all__ = ["FACTORS", "PACKAGE_ROOT", "SETTINGS_VARS", "GiB", "child_env", "make_plan"]
