"""0.3.0's module paths still import, as the modules now at the new paths, and leave them
as they are."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from plancache._moved import MOVED
from plancache.testing import child_env


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_new_module_with_a_warning(old: str) -> None:
    new = importlib.import_module(MOVED[old])
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated"):
        assert importlib.import_module(old) is new
    assert new.__spec__ is not None and new.__spec__.name == MOVED[old]


CHECK = """
import importlib, warnings
warnings.simplefilter("ignore", DeprecationWarning)
import plancache._store as module
own = module.__spec__
import plancache.store
assert module.__spec__ is own, module.__spec__
assert module.__spec__.origin.endswith("_store.py"), module.__spec__.origin
module.content_version = None  # a reload runs the module's code again
assert importlib.reload(module) is module and callable(module.content_version)
import plancache.backends.local as old, plancache._backends.local as new
assert old is new and new.__spec__.name == "plancache._backends.local", new.__spec__
print("ok")
"""


def test_an_old_path_leaves_the_new_modules_spec_alone() -> None:
    """After ``import plancache.store``, ``plancache._store`` keeps its own spec, and a
    reload runs its code again (a fresh process: nothing else imported the old path)."""
    out = subprocess.run(
        [sys.executable, "-c", CHECK], env=child_env(), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"
