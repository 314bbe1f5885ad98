"""End to end on the REAL vLLM 0.33.0 ``gpu_worker.Worker`` (``tox -e vllm``): each boot is
a fresh process running ``real_worker.py``, forked by a launcher that imported torch and vLLM
once (``launcher.py``); real ``VllmConfig``, real plugin discovery, real gloo world group for
TP=2; only the GPU memory counters and the model runner are faked. Independent boots run
side by side to keep the suite short."""

from __future__ import annotations

import importlib.metadata
import json
import signal
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from plancache import Plan, fingerprint, open_store
from plancache.testing import GiB
from plancache.testing.servers import CountingProxy, FakeGCS, MotoS3
from tests.vllm import support
from tests.vllm.launcher import Boot, Launcher
from tests.vllm.support import MODEL_CONFIG, REAL_WORKER, REPO, boot_env, vllm_installed

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed (tox -e vllm)"),
]
BOOT_TIMEOUT_S = 200.0
Report = dict[str, Any]
_launchers: list[Launcher] = []


@pytest.fixture(scope="module", autouse=True)
def _forks_from(launcher: Launcher) -> Iterator[None]:
    """Every ``boot`` of this module forks from ``launcher``."""
    _launchers.append(launcher)
    yield
    _launchers.remove(launcher)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("model")
    (directory / "config.json").write_text(json.dumps(MODEL_CONFIG))
    return directory


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def boot(
    model_dir: Path,
    store: str,
    *args: str,
    rank: int = 0,
    world: int = 1,
    port: int = 0,
    environ: Mapping[str, str] | None = None,
    **env: str,
) -> Boot:
    """Start one boot of the real worker (rank ``rank`` of ``world``) on ``store``, with
    ``environ`` and ``env`` in its environment."""
    command = [str(REAL_WORKER), "--model-dir", str(model_dir)]
    command += ["--rank", str(rank), "--world-size", str(world), "--port", str(port or _port())]
    child = boot_env(PLANCACHE_URL=store, **(environ or {}), **env)
    return _launchers[-1].start([*command, *args], child, REPO)


def outcomes(*procs: Boot) -> Iterator[tuple[int, Report, str]]:
    """Each boot's exit status, its last JSON line and its log (stdout and stderr), in order;
    every boot must end in time."""
    return support.outcomes(*procs, timeout=BOOT_TIMEOUT_S)


def reports(*procs: Boot) -> Iterator[tuple[Report, str]]:
    """Each boot's JSON report and its log, in order; every boot must exit 0 in time."""
    for returncode, report, log in outcomes(*procs):
        assert returncode == 0, log[-4000:]
        yield report, log


def test_single_rank_miss_hit_gate_explicit_and_xpu(model_dir: Path, tmp_path: Path) -> None:
    """miss -> profile -> save; then a hit (memory profiling and the CUDA-graph estimate
    skipped), a gate rejection, an explicit value, and a non-CUDA device (XPU: facts from
    ``current_platform`` alone, capability None) miss then hit."""
    cuda, explicit_store, xpu = (str(tmp_path / name) for name in ("cuda", "explicit", "xpu"))
    seven = str(7 * GiB)
    (miss, _), (explicit, _), (xpu_miss, _) = reports(
        boot(model_dir, cuda, "--graphs"),
        boot(model_dir, explicit_store, "--graphs", "--kv-bytes", seven),
        boot(model_dir, xpu, "--graphs", "--device-kind", "xpu"),
    )
    (hit, hit_log), (gated, gated_log), (xpu_hit, _) = reports(
        boot(model_dir, cuda, "--graphs"),
        boot(model_dir, cuda, "--graphs", "--free-gib", "75"),
        boot(model_dir, xpu, "--graphs", "--device-kind", "xpu"),
    )

    assert (miss["mode"], miss["reason"], miss["saved"]) == ("profiling", "miss", "created")
    assert "cudagraph-estimate" in miss["events"]
    assert miss["kv"] == miss["available_kv"] == 57284126311  # profiled: see real_worker.py
    factors = miss["factors"]
    assert (factors["device_name"], factors["device_capability"]) == ("Fake cuda GPU", "9.0")
    assert factors["device_total_memory"] == 80 * GiB
    assert factors["vllm"] == importlib.metadata.version("vllm")
    assert "disable_custom_all_reduce" in factors
    assert miss["labels"]["model"] == str(model_dir)
    assert miss["labels"]["tensor_parallel_size"] == 1
    assert miss["labels"]["dtype"] == "bfloat16"  # as the CPU platform resolves float32

    assert (hit["mode"], hit["reason"], hit["saved"]) == ("applied", "hit", None)
    assert hit["kv"] == miss["kv"] and hit["available_kv"] is None
    assert hit["events"] == ["profile_run"]  # no CUDA-graph estimate, no memory profiling
    assert "applies plan" in hit_log and "memory profiling skipped" in hit_log

    assert (gated["mode"], gated["reason"]) == ("profiling", "gate:free-memory-below-baseline")
    assert "cudagraph-estimate" in gated["events"]
    assert gated["available_kv"] == gated["kv"]  # profiled
    assert "lookup gate:free-memory-below-baseline" in gated_log

    assert (explicit["mode"], explicit["saved"]) == ("explicit", None)
    assert explicit["kv"] == 7 * GiB and "cudagraph-estimate" not in explicit["events"]
    written = [p.name for p in Path(explicit_store).rglob("*.json")]
    assert all(n.startswith("boot_report_") for n in written), written  # no plan recorded

    assert (xpu_miss["mode"], xpu_miss["saved"]) == ("profiling", "created")
    assert xpu_miss["factors"]["device_name"] == "Fake xpu GPU"
    assert xpu_miss["factors"]["device_capability"] == ""
    assert (xpu_hit["mode"], xpu_hit["kv"]) == ("applied", xpu_miss["kv"])


def test_two_ranks_agree_late_rank_and_explicit_on_one_rank(
    model_dir: Path, tmp_path: Path
) -> None:
    """TP=2 over gloo: miss on both ranks, then a hit with rank 1 arriving 4 s late (both
    apply, the next world-group collective pairs); explicit on rank 0 only with no plan on
    rank 1: no hang, an error naming the cause, the next collective pairs."""
    tp, mixed = str(tmp_path / "tp"), str(tmp_path / "mixed")
    first, second = _port(), _port()
    results = list(
        reports(
            boot(model_dir, tp, rank=0, world=2, port=first),
            boot(model_dir, tp, rank=1, world=2, port=first),
            boot(model_dir, mixed, "--kv-bytes", str(7 * GiB), rank=0, world=2, port=second),
            boot(model_dir, mixed, rank=1, world=2, port=second),
        )
    )
    (miss0, _), (miss1, _), (mixed0, log0), (mixed1, log1) = results
    assert [r["mode"] for r in (miss0, miss1)] == ["profiling", "profiling"]
    assert [r["saved"] for r in (miss0, miss1)] == ["created", "created"]
    assert miss0["tally"] == {"explicit": 0, "apply": 0, "profile": 2}
    assert [r["world_allreduce"] for r in (miss0, miss1)] == [3, 3]
    assert (mixed0["mode"], mixed1["mode"]) == ("explicit", "profiling")
    assert [r["world_allreduce"] for r in (mixed0, mixed1)] == [3, 3]
    for log in (log0, log1):
        assert "explicit on 1 of 2 ranks while 1 must profile" in log
    assert mixed0["cpu_timeout"] == "None"  # vLLM's default: gloo's own 30 min

    third = _port()
    (hit0, _), (hit1, _) = reports(
        boot(model_dir, tp, rank=0, world=2, port=third),
        boot(model_dir, tp, "--load-s", "4", rank=1, world=2, port=third),
    )
    assert [r["mode"] for r in (hit0, hit1)] == ["applied", "applied"]
    assert hit0["tally"] == hit1["tally"] == {"explicit": 0, "apply": 2, "profile": 0}
    assert [r["world_allreduce"] for r in (hit0, hit1)] == [3, 3]
    assert hit0["times"]["determine"] > 2.0  # rank 0 waited in the vote for its late peer


def test_plugin_cost_with_a_slow_remote_store(model_dir: Path, tmp_path: Path) -> None:
    """S3 (moto) behind a loopback proxy that delays every request by 300 ms, weights that
    take 2 s to load: the fetch overlaps the load, so the plugin adds next to nothing to
    ``determine_available_memory`` on a hit, and the save adds next to nothing to
    ``compile_or_warm_up_model`` on a miss."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed (tox -e vllm)")
    pytest.importorskip("s3fs", reason="s3fs is not installed (tox -e vllm)")
    from tests.vllm.slow_store import slow_s3

    # the first node's save waits for the probe claim's round: at 300 ms a request, the
    # verdict's read, the claim (2), the verdict's read again, the probe (12), its share and
    # the claim's release, about 5.4 s, then the record's read and write, about 6.6 s in all
    # on a quiet machine: the budget leaves it more than twice that (a loaded CI machine)
    budget = "15"
    with slow_s3(delay_s=0.3) as (url, options):
        opts = json.dumps(options)
        flags = ("--graphs", "--load-s", "2")
        [(miss, _)] = reports(
            boot(model_dir, url, *flags, PLANCACHE_STORAGE_OPTIONS=opts, PLANCACHE_TIMEOUT=budget)
        )
        [(hit, _)] = reports(
            boot(model_dir, url, *flags, PLANCACHE_STORAGE_OPTIONS=opts, PLANCACHE_TIMEOUT=budget)
        )
    assert (miss["mode"], miss["saved"], hit["mode"]) == ("profiling", "created", "applied")
    costs = {
        "miss: load_model": miss["costs"]["load_model"],
        "miss: determine_available_memory": miss["costs"]["determine_available_memory"],
        "miss: compile_or_warm_up_model (save)": miss["costs"]["compile_or_warm_up_model"],
        "hit: load_model": hit["costs"]["load_model"],
        "hit: determine_available_memory": hit["costs"]["determine_available_memory"],
    }
    print("\nplugin's critical-path cost, S3 +300 ms per request, 2 s weight load:")
    for name, seconds in costs.items():
        print(f"  {name}: {seconds * 1e3:.2f} ms")
    assert costs["hit: determine_available_memory"] < 0.05
    assert costs["miss: compile_or_warm_up_model (save)"] < 0.05


# -- bad plans ---------------------------------------------------------------------------------
BAD = (40 * GiB, 70 * GiB)
"""A plausible observation (KV below requested 73.6 GiB minus 16 GiB of weights) whose boots
die in the warm-up: a plan that does not fit after all."""
WRITES = {"PUT", "POST", "DELETE", "PATCH"}


def _bounded(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with 20 s per remote call (boots' and the test's own): the 3 s default can
    pass on a loaded machine, where a client's first call loads its TLS settings."""
    return {**options, "timeout": 20.0} if "://" in url else options


def _record(url: str, options: dict[str, Any], fp: str) -> Plan | None:
    """The record at ``fp``, read by the test itself."""
    return open_store(url, **_bounded(url, options)).get(fp)


class Node:
    """A node's settings: the shared store, its own local tier (remote stores) and default
    directory."""

    def __init__(self, home: Path, url: str, options: dict[str, Any], **extra: str) -> None:
        self.env = {
            "PLANCACHE_STORAGE_OPTIONS": json.dumps(_bounded(url, options)),
            "VLLM_CACHE_ROOT": str(home),
            "PLANCACHE_TIMEOUT": "20",  # the 2 s default can pass on a loaded machine
        }
        if "://" in url:
            self.env["PLANCACHE_LOCAL_TIER"] = str(home / "tier")
        self.env.update(extra)
        self.url = url
        self.marks = Path(self.env.get("PLANCACHE_LOCAL_TIER", url)) / "marks"

    def boot(self, model_dir: Path, *args: str) -> Boot:
        return boot(model_dir, self.url, *args, environ=self.env)


def _killed(outcome: tuple[int, Report, str]) -> Report:
    """The report of a boot that applied a plan and SIGKILLed itself in the warm-up."""
    returncode, report, log = outcome
    assert returncode == -signal.SIGKILL, log[-4000:]
    assert report["died"] and report["mode"] == "applied" and report["marked"], report
    return report


def test_a_bad_plan_costs_each_node_at_most_one_boot(
    model_dir: Path,
    tmp_path: Path,
    moto_s3: MotoS3,
    fake_gcs: FakeGCS,
    s3_bucket: str,
    gcs_bucket: str,
) -> None:
    """Real boots that apply a plausible plan and are SIGKILLed inside
    ``compile_or_warm_up_model``, on a local store and on S3 and GCS behind local tiers:
    the next boot on each node profiles (``gate:crashed-before``), the observation leaves the
    shared store, and a third node with an empty local tier does not apply it. A read-only
    node stops applying it and writes nothing (counted at a proxy). A poisoned record whose KV
    equals its baseline and the free memory is never applied (``gate:exceeds-budget``)."""
    pytest.importorskip("s3fs", reason="s3fs is not installed (tox -e vllm)")
    pytest.importorskip("gcsfs", reason="gcsfs is not installed (tox -e vllm)")
    s3_options = {"endpoint_url": moto_s3.endpoint}
    gcs_options = {"endpoint_url": fake_gcs.endpoint, "token": "anon"}
    moto_s3.create_bucket(f"{s3_bucket}-ro")
    shared = {
        "local": (str(tmp_path / "shared"), {}),
        "s3": (f"s3://{s3_bucket}/plans", s3_options),
        "gcs": (f"gs://{gcs_bucket}/plans", gcs_options),
    }
    seed = ("--seed", str(BAD[0]), str(BAD[1]))
    with CountingProxy(moto_s3.endpoint) as proxy:
        ro_url = f"s3://{s3_bucket}-ro/plans"
        read_only = Node(
            tmp_path / "ro", ro_url, {"endpoint_url": proxy.endpoint}, PLANCACHE_READ_ONLY="1"
        )
        nodes = {kind: Node(tmp_path / kind, url, o) for kind, (url, o) in shared.items()}

        # 1. every node applies the record another node wrote, and dies in the warm-up
        first = [n.boot(model_dir, *seed, "--die-in-warmup") for n in nodes.values()]
        first.append(
            read_only.boot(
                model_dir, *seed, "--seed-options", json.dumps(s3_options), "--die-in-warmup"
            )
        )
        died = [_killed(outcome) for outcome in outcomes(*first)]
        assert {d["kv"] for d in died} == {BAD[0]}
        bad = dict(zip([*nodes, "read-only"], (d["observation"] for d in died), strict=True))
        for node in [*nodes.values(), read_only]:
            assert len(list(node.marks.glob("*.mark"))) == 1

        # 2. the next boot on each node profiles, and retracts it where it may write
        second = list(reports(*(n.boot(model_dir) for n in [*nodes.values(), read_only])))
        for (report, log), digest in zip(second, bad.values(), strict=True):
            assert (report["mode"], report["avoid"], report["mark_left"]) == (
                "profiling",
                [digest],
                False,
            )
            assert report["reason"] in ("gate:crashed-before", "miss")  # miss: tombstoned
            assert "gate:crashed-before" in log and "died after applying it" in log
            assert report["saved"] in ("created", "replaced")
        profiled = second[0][0]["kv"]
        assert profiled != BAD[0]
        fp = fingerprint(second[0][0]["factors"])
        for kind, (url, options) in shared.items():
            record = _record(url, options, fp)
            assert record is not None, kind
            assert [t.observation for t in record.retracted] == [bad[kind]], kind
            assert [o.kv_cache_memory_bytes for o in record.observations] == [profiled], kind

        writes = [r for r in proxy.requests if r[0] in WRITES]
        assert not writes and proxy.requests  # the read-only node read, never wrote
        stale = _record(ro_url, s3_options, fp)
        assert stale is not None and bad["read-only"] in {o.digest for o in stale.observations}

    # 3. a third node with an empty local tier applies the new observation, not the bad one;
    # a poisoned record (KV = baseline = free memory) is never applied
    (third, _), (poison, poison_log) = reports(
        Node(tmp_path / "third", *shared["gcs"]).boot(model_dir),
        Node(tmp_path / "poisoned", str(tmp_path / "poisoned-store"), {}).boot(
            model_dir, "--seed", str(78 * GiB), str(78 * GiB)
        ),
    )
    assert (third["mode"], third["kv"], third["reason"]) == ("applied", profiled, "hit")
    assert (poison["mode"], poison["reason"]) == ("profiling", "gate:exceeds-budget")
    assert poison["available_kv"] == poison["kv"]  # profiled
    assert "lookup gate:exceeds-budget" in poison_log and "exceeds requested=" in poison_log
    recover = max(r["costs"]["breaker.recover"] for r, _ in second)
    print(f"\nbreaker.recover with a dead mark: {recover * 1e3:.2f} ms (slowest of 4)")
    print(f"breaker.arm: {third['costs']['breaker.arm'] * 1e3:.2f} ms")


def test_a_compiling_boots_plan_is_provisional_and_one_warm_profile_replaces_it(
    model_dir: Path, tmp_path: Path
) -> None:
    """vLLM #54122 on the real worker: a boot that compiles during its profile run counts the
    compile's temporaries as activation memory and allocates less KV cache. Its observation
    is provisional: another compiling node applies it, the first node that loads the compiled
    code profiles once instead, and from then on every node, compiling or not, applies that
    warm plan; the record ends holding only the warm observation."""
    store = str(tmp_path / "store")

    def node(name: str, *args: str, free_gib: str = "78") -> Boot:
        root = str(tmp_path / name / "vllm")
        return boot(
            model_dir, store, "--compiled", *args, "--free-gib", free_gib, VLLM_CACHE_ROOT=root
        )

    # 1. the fleet's first node compiles, profiles and records a provisional observation
    ((cold, cold_log),) = reports(node("cold"))
    assert (cold["mode"], cold["reason"], cold["compiled"]) == ("profiling", "miss", True)
    assert cold["saved"] == "created" and "compiled" in cold["events"]
    assert "provisional (compiled during profiling)" in cold_log
    # 2. another node that compiles applies it; nothing is saved
    ((twin, twin_log),) = reports(node("twin"))
    assert (twin["mode"], twin["compiles"], twin["provisional"]) == ("applied", True, True)
    assert twin["kv"] == cold["kv"] and "applies provisional plan" in twin_log
    # 3. the first node that loads the compiled code profiles once, without the temporaries
    ((warm, warm_log),) = reports(node("warm", "--artifact"))
    assert (warm["mode"], warm["reason"], warm["compiles"]) == (
        "profiling",
        "gate:provisional",
        False,
    )
    assert (warm["compiled"], warm["saved"]) == (False, "replaced")
    assert "aot-loaded" in warm["events"] and "gate:provisional" in warm_log
    compile_peak = 8 * GiB - 3 * GiB  # the temporaries over the activations' 3 GiB
    assert warm["kv"] == cold["kv"] + compile_peak
    # 4. every later node applies the warm plan, those that compile too; none profiles
    later = list(
        reports(
            node("next", "--artifact"),
            node("roomier", "--artifact", free_gib="78.5"),
            node("recompiles"),
        )
    )
    for report, _ in later:
        assert (report["mode"], report["kv"], report["provisional"]) == (
            "applied",
            warm["kv"],
            False,
        ), report
    assert "compiled" in later[2][0]["events"]  # it compiled, before the KV cache existed
    record = _record(store, {}, fingerprint(cold["factors"]))
    assert record is not None and record.provisional == ()
    assert [o.kv_cache_memory_bytes for o in record.observations] == [warm["kv"]]
