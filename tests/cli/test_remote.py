"""Every subcommand against S3 (moto) and GCS (fake-gcs-server) stores."""

from __future__ import annotations

import json
from pathlib import Path

from plancache import fingerprint, open_store
from plancache.testing import GiB, child_env
from tests.cli.helpers import RemoteSpec, fill, ok, record_bytes, run, write_raw


def test_remote_store_end_to_end(tmp_path: Path, remote: RemoteSpec) -> None:
    url, options = remote
    opts = json.dumps(options)
    local = tmp_path / "local"
    fill(local, 3)
    bad = fingerprint({"model": "broken"})
    write_raw(local, bad, record_bytes(kv_cache_memory_bytes=3 * GiB))

    out = ok("cp", str(local), url, "--dst-storage-options", opts)
    assert "3 created, 0 replaced, 0 kept, 1 invalid skipped" in out
    rows = json.loads(ok("ls", url, "--json", "--storage-options", opts))
    fps = sorted(r["fingerprint"] for r in rows)
    assert fps == sorted(set(open_store(str(local)).iter_fingerprints()) - {bad})
    # the shared --storage-options flag applies to the remote side only
    assert "0 created, 0 replaced, 3 kept" in ok("cp", str(local), url, "--storage-options", opts)

    env = child_env(PLANCACHE_URL=url, PLANCACHE_STORAGE_OPTIONS=opts)
    stats = json.loads(ok("stats", "--json", env=env))
    assert (stats["url"], stats["plans"], stats["invalid"]) == (url, 3, 0)
    assert ok("show", fps[0][:10], env=env).startswith(f"fingerprint  {fps[0]}")

    back = tmp_path / "back"
    out = ok("cp", url, str(back), "--src-storage-options", opts)
    assert "3 created, 0 replaced, 0 kept, 0 invalid skipped" in out
    assert sorted(open_store(str(back)).iter_fingerprints()) == fps

    # an invalid record planted in the bucket is found, and --fix deletes it
    store = open_store(url, **options)
    try:
        assert store._create(bad, record_bytes(kv_cache_memory_bytes=3 * GiB))
    finally:
        store.close()
    result = run("verify", env=env)
    assert result.returncode == 1 and f"{bad}  kv_cache_memory_bytes" in result.stdout
    assert "1 deleted" in ok("verify", "--fix", env=env)

    assert ok("rm", fps[0][:10], env=env) == f"deleted {fps[0]}\n"
    assert "would delete 0 plans" in ok("prune", "--older-than", "1d", "--dry-run", env=env)
    assert len(json.loads(ok("ls", "--json", env=env))) == 2
