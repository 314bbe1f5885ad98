"""One rule for naming the store: every command on one store takes ``--url URL``; those whose
only operand is the store take it as ``URL`` too; both, with different values, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plancache.testing import child_env
from tests.cli.helpers import LocalFixture, failure, run


def test_every_command_on_one_store_takes_url(tmp_path: Path, store: LocalFixture) -> None:
    root, plans, bad = store
    url = str(root)
    # PLANCACHE_URL names no store: whatever a command shows comes from --url
    env = child_env(PLANCACHE_URL=str(tmp_path / "elsewhere"), VLLM_CACHE_ROOT=str(tmp_path))

    def done(*args: str, code: int = 0) -> str:
        result = run(*args, "--url", url, env=env)
        assert result.returncode == code, (args, result.stdout, result.stderr)
        return result.stdout

    assert done("ls").splitlines()[-1] == f"3 plans, 1 invalid, in {url}"
    assert json.loads(done("stats", "--json"))["plans"] == 3
    assert bad in done("verify", code=1)
    assert f"in {url}, would delete 1 plan" in done("prune", "--older-than", "30d", "--dry-run")
    doctor = run("doctor", "--json", "--url", url, env=env)  # 1: something on this node
    assert doctor.returncode in (0, 1) and json.loads(doctor.stdout)["url"] == url
    assert done("show", plans[1].fingerprint[:12]).startswith(
        f"fingerprint  {plans[1].fingerprint}"
    )
    assert done("rm", plans[2].fingerprint[:12]) == f"deleted {plans[2].fingerprint}\n"
    # the operand and --url naming the same store is one store
    assert run("stats", url, "--url", url, env=env).returncode == 0


@pytest.mark.parametrize(
    "args",
    [["ls"], ["verify"], ["prune", "--older-than", "1d"], ["stats"], ["doctor"]],
    ids=lambda a: a[0],
)
def test_two_different_stores_are_refused(args: list[str], tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    err = failure(args[0], str(tmp_path / "a"), *args[1:], "--url", str(tmp_path / "b"))
    assert err == (
        f"plancache: error: {args[0]}: the store is given twice, as URL '{tmp_path / 'a'}' "
        f"and as --url '{tmp_path / 'b'}': give it once\n"
    )
