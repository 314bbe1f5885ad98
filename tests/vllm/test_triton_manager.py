"""``TRITON_CACHE_MANAGER=plancache.integrations.triton:CacheManager`` between fresh processes,
each with its own ``TRITON_CACHE_DIR`` (the producer's removed before the next one runs),
compiling real Triton kernels for a CUDA target (sm_90) on this CPU (``tox -e vllm``: it has
Triton). What each process compiled is counted by Triton's own compilation listener
(``triton_manager_node.py``), not by files."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from plancache import open_store
from plancache.testing import child_env
from plancache.testing.hostile import SilentServer
from plancache.testing.servers import MotoS3
from tests.helpers import LOOSE_OPTIONS
from tests.vllm import support
from tests.vllm.support import HERE, REPO

pytest.importorskip("triton", reason="needs Triton (tox -e vllm)")
pytestmark = pytest.mark.timeout(600)

NODE = HERE / "triton_manager_node.py"
MANAGER = "plancache.integrations.triton:CacheManager"
KERNELS = 4
KEY = secrets.token_hex(32)
OTHER = secrets.token_hex(32)
Store = tuple[str, dict[str, str]]
"""A store's URL and the settings a process needs to use it (``PLANCACHE_*``)."""


def _node(
    root: Path,
    store: Store | None,
    kernels: int = KERNELS,
    manager: str = MANAGER,
    *args: str,
    **env: str,
) -> dict[str, Any]:
    """Run one process with its own cache directory ``root/triton`` and default directory
    ``root/vllm``, Triton's cache manager ``manager`` (empty: Triton's own); its report (and
    ``log``: its output)."""
    settings = {} if store is None else {"PLANCACHE_URL": store[0], **store[1]}
    if manager:
        settings["TRITON_CACHE_MANAGER"] = manager
    proc = subprocess.Popen(
        [sys.executable, str(NODE), "--kernels", str(kernels), *args],
        env=child_env(
            [REPO],
            **{
                "TRITON_DEFAULT_FP_FUSION": "1",
                "TRITON_CACHE_DIR": str(root / "triton"),
                "VLLM_CACHE_ROOT": str(root / "vllm"),
                **settings,
                **env,
            },
        ),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    [(code, report, log)] = list(support.outcomes(proc, timeout=300))
    assert code == 0, log[-4000:]
    assert report["manager"] == manager
    report["log"] = log
    report["exit_s"] = time.time() - report["said_at"]  # the report's line to the exit
    return report


@pytest.fixture(params=["local", "s3-signed"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A local directory store owned by this user (unsigned bundles are trusted from it), or
    a bucket on moto with every bundle signed."""
    if request.param == "local":
        return str(tmp_path / "store"), {}
    moto: MotoS3 = request.getfixturevalue("moto_s3")
    bucket = f"triton-{secrets.token_hex(6)}"
    moto.create_bucket(bucket)
    options = {"endpoint_url": moto.endpoint, **LOOSE_OPTIONS}
    return f"s3://{bucket}/shared", {
        "PLANCACHE_STORAGE_OPTIONS": json.dumps(options),
        "PLANCACHE_SIGNING_KEY": KEY,
    }


def _bundles(store: Store) -> list[str]:
    url, settings = store
    options = json.loads(settings.get("PLANCACHE_STORAGE_OPTIONS", "{}"))
    opened = open_store(url, **options)
    try:
        return sorted(opened.layer.list_objects("cache_triton_"))
    finally:
        opened.close()


def test_a_second_process_compiles_no_kernel_and_gets_the_same_binaries(
    store: Store, tmp_path: Path
) -> None:
    first = _node(tmp_path / "first", store)
    assert (first["compiled"], first["hits"]) == (KERNELS, 0), first["log"][-3000:]
    assert len(_bundles(store)) == 1  # pushed at exit, as one bundle
    shutil.rmtree(tmp_path / "first")  # the producer's paths are gone
    second = _node(tmp_path / "second", store)
    assert (second["compiled"], second["hits"]) == (0, KERNELS), second["log"][-3000:]
    assert second["cubins"] == first["cubins"]
    assert "triton cache: hit, 1 bundles" in second["log"]
    assert "compiled although" not in second["log"]  # every shared kernel was used
    assert len(_bundles(store)) == 1  # it added nothing: nothing written
    third = _node(tmp_path / "third", store, KERNELS + 1)  # one kernel more
    assert (third["compiled"], third["hits"]) == (1, KERNELS), third["log"][-3000:]
    assert (  # the one kernel no bundle held, named as built anyway
        "1 kernels compiled although 1 bundles were installed (matmul)" in third["log"]
    ), third["log"][-3000:]
    assert len(_bundles(store)) == 2  # what it added, and only that
    fourth = _node(tmp_path / "fourth", store, KERNELS + 1)
    assert (fourth["compiled"], fourth["hits"]) == (0, KERNELS + 1), fourth["log"][-3000:]
    # a setting in Triton's key differs: every kernel is built again, and counted
    fifth = _node(tmp_path / "fifth", store, KERNELS + 1, TRITON_DEFAULT_FP_FUSION="0")
    assert fifth["compiled"] == KERNELS + 1, fifth["log"][-3000:]
    assert (
        f"{KERNELS + 1} kernels compiled although 2 bundles were installed (matmul)" in fifth["log"]
    ), fifth["log"][-3000:]


def test_bundles_no_accepted_key_signed_are_refused_and_triton_compiles(tmp_path: Path) -> None:
    """Unsigned bundles in a local store: a process with a key requires a signature; bundles
    signed by one key: a process that accepts another refuses them."""
    unsigned: Store = (str(tmp_path / "unsigned"), {})
    _node(tmp_path / "a", unsigned)
    keyed = _node(tmp_path / "b", unsigned, PLANCACHE_SIGNING_KEY=KEY)
    assert (keyed["compiled"], keyed["hits"]) == (KERNELS, 0), keyed["log"][-3000:]
    signed: Store = (str(tmp_path / "signed"), {"PLANCACHE_SIGNING_KEY": KEY})
    _node(tmp_path / "c", signed)
    other = _node(tmp_path / "d", (signed[0], {"PLANCACHE_SIGNING_KEY": OTHER}))
    assert (other["compiled"], other["hits"]) == (KERNELS, 0), other["log"][-3000:]
    assert "not installed" in other["log"]


def test_without_plancache_configured_it_is_tritons_file_cache(tmp_path: Path) -> None:
    """No ``PLANCACHE_URL``: nothing pulled or pushed, and Triton's own cache directory works
    through the manager as through Triton's file cache manager."""
    first = _node(tmp_path / "first", None)
    assert (first["compiled"], first["hits"]) == (KERNELS, 0)
    again = _node(tmp_path / "first", None)  # the same directory: Triton's own cache
    assert (again["compiled"], again["hits"]) == (0, KERNELS)
    other = _node(tmp_path / "other", None)
    assert (other["compiled"], other["hits"]) == (KERNELS, 0)
    default = tmp_path / "first" / "vllm" / "startup_plan"
    assert not default.exists() or not any(default.glob("cache_*")), "stored without a URL"
    off = _node(tmp_path / "off", (str(tmp_path / "store"), {}), PLANCACHE_TRITON_CACHE="0")
    assert off["compiled"] == KERNELS and not (tmp_path / "store").exists()


def test_a_store_that_never_answers_delays_neither_compiles_nor_exit_past_the_bounds(
    tmp_path: Path,
) -> None:
    """S3 on an endpoint that accepts connections and never answers: Triton waits for the
    pull at most ``PLANCACHE_COMPILE_TIMEOUT`` and compiles, and the exit waits for the push
    at most ``PLANCACHE_COMPILE_EXIT_WAIT``."""
    with SilentServer() as silent:
        store: Store = (
            "s3://silent/shared",
            {
                "PLANCACHE_STORAGE_OPTIONS": json.dumps({"endpoint_url": silent.endpoint}),
                "PLANCACHE_SIGNING_KEY": KEY,
                "PLANCACHE_COMPILE_TIMEOUT": "2",
                "PLANCACHE_COMPILE_EXIT_WAIT": "1",
            },
        )
        report = _node(tmp_path / "node", store)
    assert (report["compiled"], report["hits"]) == (KERNELS, 0), report["log"][-3000:]
    assert "pull not done within 2 s" in report["log"]
    assert "push not done within 1 s at exit: abandoned" in report["log"]
    # the exit's 1 s, then the interpreter's own end (torch's and Triton's, well under 1 s
    # on a quiet machine; seconds at load 10): measured from the report, not from the start
    assert report["exit_s"] < 1 + 8, report["log"][-3000:]
    assert report["compile_s"] < 2 + 5  # the pull's 2 s, then 4 compiles (about 2 s here)


def test_the_command_carries_a_triton_cache_between_plain_triton_processes(
    tmp_path: Path,
) -> None:
    """A build step pushes what plain Triton (no manager) compiled with ``plancache cache
    push --kind triton``; an init container pulls it into another directory with ``cache
    pull``; plain Triton there compiles nothing (the group files were re-rooted)."""
    store = str(tmp_path / "store")
    built = _node(tmp_path / "build", None, manager="")
    assert built["compiled"] == KERNELS
    env = child_env([REPO], PLANCACHE_SIGNING_KEY=KEY)
    cli = [sys.executable, "-m", "plancache", "cache"]
    where = ["--kind", "triton", "--url", store, "--json"]
    done = subprocess.run(
        [*cli, "push", "--dir", str(tmp_path / "build" / "triton"), *where],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["written"] == {"store": True}
    shutil.rmtree(tmp_path / "build")
    done = subprocess.run(
        [*cli, "pull", "--dir", str(tmp_path / "node" / "triton"), *where],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["reason"] == "hit"
    node = _node(tmp_path / "node", None, manager="")
    assert (node["compiled"], node["hits"]) == (0, KERNELS), node["log"][-3000:]
    assert node["cubins"] == built["cubins"]


def test_push_stores_what_a_process_added_before_it_is_killed(tmp_path: Path) -> None:
    """A process killed by a signal runs no exit handler: ``push()`` once warm stored its
    kernels, and the next process compiles none."""
    store: Store = (str(tmp_path / "store"), {"PLANCACHE_SIGNING_KEY": KEY})
    server = _node(tmp_path / "server", store, KERNELS, MANAGER, "--push-then-die")
    assert server["compiled"] == KERNELS
    [files] = server["pushed"]  # one bundle: every file of its kernels (8 each in Triton 3.9)
    assert files >= KERNELS
    assert len(_bundles(store)) == 1
    shutil.rmtree(tmp_path / "server")
    second = _node(tmp_path / "second", store)
    assert (second["compiled"], second["hits"]) == (0, KERNELS), second["log"][-3000:]
