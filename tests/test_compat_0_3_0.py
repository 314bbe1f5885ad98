"""Programs written for plancache 0.3.0 keep working, or fail loudly (issue 43, item 5).

Every usage the 0.3.0 README and docs show (the release's commit, ``RELEASE``: its ``python``
blocks verbatim, the calls its prose names, its settings and its commands) runs here, each in
a fresh interpreter, against this release: it works (a deprecated path warns and works), or
it fails where the program first uses it with a ``PlancacheError`` whose message names what
to write now. None of them fails open: 0.4.0 ran ``PlanCache(LocalStore(path))`` and then
failed every lookup and record with ``TypeError: 'LocalStore' object is not callable``
(reason ``error``), sharing nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from plancache import ConfigError, PlanCache, PlanStore
from plancache.testing import LocalLayer
from tests.test_docs import FENCE, ROOT, seed

RELEASE = "a5f2e6f"
"""The commit of the 0.3.0 release ("Version 0.3.0; CHANGELOG for it")."""

QUICKSTART = '''\
from plancache import PlanCache

cache = PlanCache.from_env()  # the store, local tier, keys and budget of every PLANCACHE_* setting

factors = {  # everything the KV-cache size depends on; the key is their sha256
    "model": "Qwen/Qwen3-8B",
    "gpu_memory_utilization": 0.9,
    "device_name": "NVIDIA H100 80GB HBM3",
}
free_bytes = 79 << 30  # free device memory now (e.g. torch.cuda.mem_get_info()[0])


def profile() -> int:
    """Stands in for the expensive path: profiling the KV-cache size."""
    return 52 << 30


d = cache.lookup(factors, current_free_memory=free_bytes)
if d.kv_cache_memory_bytes is None:  # d.reason says why: miss, gate:..., timeout, ...
    kv = profile()
    cache.record(factors, kv_cache_memory_bytes=kv, free_memory_baseline=free_bytes)
    d = cache.lookup(factors, current_free_memory=free_bytes)  # the next boot's lookup
print(d.reason, d.kv_cache_memory_bytes)  # hit 55834574848
'''
"""0.3.0's README.md, its one ``python`` block."""

STORE_CONTRACT = """\
from functools import partial

import pytest

from plancache.backends.local import LocalStore
from plancache.fingerprint import object_name
from plancache.testing import StoreContract


class MyStore(LocalStore):
    \"\"\"Your backend: here, a directory.\"\"\"


class TestMyStore(StoreContract):
    @pytest.fixture
    def store_factory(self, tmp_path):  # picklable: the process race reopens it in children
        return partial(MyStore, tmp_path)

    @pytest.fixture
    def write_raw(self, tmp_path):  # stores bytes as a record, past the store's own checks
        return lambda fp, data: (tmp_path / object_name(fp)).write_bytes(data)
"""
"""0.3.0's docs/testing-stores.md, its one ``python`` block."""

WORKS = "works"
FACTORS = "f = {'model': 'm'}\n"


def _uses() -> list[tuple[str, str, str, str]]:
    """(where in 0.3.0's docs, code, WORKS or the error it raises, what its message names)."""
    record = "c.record(f, kv_cache_memory_bytes=1 << 30, free_memory_baseline=2 << 30)\n"
    hit = "assert c.lookup(f, current_free_memory=3 << 30).reason == 'hit'\n"
    return [
        ("README.md", QUICKSTART, WORKS, "hit 55834574848"),
        ("docs/testing-stores.md", STORE_CONTRACT, "MovedModuleError", "plan_object_name(fp)"),
        (
            "issue 43: a backend given to PlanCache",
            "import sys\nfrom plancache import PlanCache\n"
            "from plancache.backends.local import LocalStore\n"
            f"{FACTORS}c = PlanCache(LocalStore(sys.argv[1]))\n{record}{hit}"
            "c = PlanCache(lambda: LocalStore(sys.argv[1]))\n" + hit,
            WORKS,
            "",
        ),
        (
            "docs/library.md: PlanCache(store, timeout=)",
            "import sys\nfrom plancache import PlanCache, open_store\n"
            f"{FACTORS}c = PlanCache(open_store(sys.argv[1]), timeout=2.0)\n{record}{hit}",
            WORKS,
            "",
        ),
        (
            "docs/stores.md: open_store(url, **storage_options)",
            "from plancache import open_store\n"
            "assert list(open_store('memory://plans').iter_fingerprints()) == []\n",
            WORKS,
            "",
        ),
        (
            "docs/stores.md: plancache.config.Settings.from_env().open_store()",
            "import plancache.config\nfrom plancache import PlanCache\n"
            f"{FACTORS}c = PlanCache(plancache.config.Settings.from_env().open_store())\n"
            f"{record}{hit}",
            WORKS,
            "",
        ),
        (
            "docs/stores.md: LocalStore.remove_stale_temp_files()",
            "import sys\nfrom plancache.backends.local import LocalStore\n"
            "assert LocalStore(sys.argv[1]).remove_stale_temp_files() == 0\n",
            WORKS,
            "",
        ),
        (
            "docs/reliability.md: PlanCache(timeout=), LocalStore.lock_timeout",
            "from plancache import PlanCache\nfrom plancache.backends.local import LocalStore\n"
            "assert LocalStore.lock_timeout == 5.0\n"
            "assert PlanCache.from_env().timeout == 2.0\n",
            WORKS,
            "",
        ),
        (
            "docs/benchmarks.md: LocalStore.get",
            "import sys\nfrom plancache.backends.local import LocalStore\n"
            "LocalStore(sys.argv[1]).get('0' * 64)\n",
            "MovedError",
            "PlanStore(layer).get(...) or open_store(url).get(...)",
        ),
        (
            "docs/threat-model.md: Budget(requested_memory, weights_memory), PlanCache.retract",
            "from plancache import PlanCache\nfrom plancache.gate import Budget\n"
            "import plancache.breaker\n"
            "Budget(requested_memory=80 << 30, weights_memory=16 << 30)\n"
            "assert callable(PlanCache.retract)\n",
            WORKS,
            "",
        ),
        (
            "docs/vllm.md: maybe_apply_startup_plan, maybe_save_startup_plan, warmed_up",
            "from plancache.integrations.vllm import (\n"
            "    maybe_apply_startup_plan, maybe_save_startup_plan, warmed_up)\n",
            WORKS,
            "",
        ),
        (
            "README.md: the bash and yaml blocks' settings",
            "import os\nfrom plancache import Settings\n"
            "from plancache._switches import enabled\n"
            "s = Settings.from_env({'PLANCACHE_URL': 's3://ml-fleet-plans/vllm',\n"
            "    'PLANCACHE_TIMEOUT': '2', 'PLANCACHE_LOCAL_TIER': '/var/cache/plancache',\n"
            "    'PLANCACHE_READ_ONLY': '1',\n"
            "    'FSSPEC_S3_ENDPOINT_URL': 'http://minio.storage:9000'})\n"
            "assert (s.timeout, s.local_tier, s.read_only) == (2.0, '/var/cache/plancache', True)\n"
            "assert enabled({'VLLM_ENABLE_STARTUP_PLAN': '1'})\n",
            WORKS,
            "",
        ),
    ]


def _env(tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PLANCACHE_", "VLLM_"))}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {
        **clean,
        "HOME": str(home),
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm"),
        "PLANCACHE_URL": str(tmp_path / "store"),
        "PYTHONPATH": str(ROOT),
    }


USES = _uses()


@pytest.mark.parametrize(("where", "code", "outcome", "names"), USES, ids=[u[0] for u in USES])
def test_a_0_3_0_usage_works_or_fails_loudly(
    where: str, code: str, outcome: str, names: str, tmp_path: Path
) -> None:
    script = tmp_path / "program.py"
    script.write_text(code)
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "plans")],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        cwd=tmp_path,
        timeout=120,
    )
    if outcome == WORKS:
        assert result.returncode == 0, (where, result.stderr)
        assert names in result.stdout, where
        return
    assert result.returncode == 1, (where, result.stdout)
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"plancache.errors.{outcome}: "), (where, last)
    assert names in last, (where, last)


def test_what_is_no_store_is_refused_when_the_cache_is_built(tmp_path: Path) -> None:
    """Not a store, a layer or a factory: refused at construction, naming the ways; a factory
    that returns something else is named in the lookup's reason."""
    with pytest.raises(ConfigError, match=r"write PlanCache\(open_store\(url\)\)"):
        PlanCache("s3://bucket/plans")  # type: ignore[arg-type]
    cache = PlanCache(lambda: "s3://bucket/plans")  # type: ignore[arg-type,return-value]
    decision = cache.lookup({"model": "m"}, current_free_memory=1 << 30)
    assert decision.reason == "error" and "gave a str, not a store" in decision.detail
    assert PlanCache(PlanStore(LocalLayer(tmp_path))).store.layer.url == str(tmp_path)


@pytest.mark.parametrize("command", [["ls"], ["show", "2f6f1f"]])
def test_the_0_3_0_commands_run(command: list[str], tmp_path: Path) -> None:
    """docs/cli.md's console block of 0.3.0: ``plancache ls``, ``plancache show 2f6f1f``."""
    env = _env(tmp_path)
    seed(Path(env["PLANCACHE_URL"]))
    result = subprocess.run(
        [sys.executable, "-m", "plancache", *command],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "2f6f1f" in result.stdout


def test_the_uses_cover_every_python_block_of_0_3_0() -> None:
    """The ``python`` blocks above are 0.3.0's, every one of them (read from git where the
    history is there)."""
    try:
        files = subprocess.run(
            ["git", "ls-tree", "--name-only", RELEASE, "README.md", "CONTRIBUTING.md", "docs/"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
            timeout=60,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        pytest.skip(f"no git history with {RELEASE} here")
    found = []
    for name in files:
        if name.endswith(".md"):
            text = subprocess.run(
                ["git", "show", f"{RELEASE}:{name}"], capture_output=True, text=True, cwd=ROOT
            ).stdout
            found += [m.group(2) for m in FENCE.finditer(text) if m.group(1) == "python"]
    assert found == [QUICKSTART, textwrap.dedent(STORE_CONTRACT)]
