"""Peak memory of one node storing, then fetching and installing, a large compile artifact
(run as its own process, so that its peak RSS is the client's alone).

usage: python -m benchmarks.artifact_memory URL OPTIONS_JSON WORKDIR
``WORKDIR/tree/<KEY>`` holds the artifact (``make_tree``, run by the caller beforehand).
Prints one JSON line: the peak RSS once the store is open and after storing and fetching,
and the seconds each step took.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

from plancache._artifacts.engine import CompileSettings
from plancache._artifacts.store import ArtifactStore
from plancache._config import Settings

KEY, RANK = "f" * 64, "rank_0_0"


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_tree(work: Path, size_mib: int) -> Path:
    """An artifact directory holding a ``size_mib`` incompressible ``model``."""
    tree = work / "tree" / KEY
    (tree / "inductor_cache" / "ab").mkdir(parents=True, exist_ok=True)
    (tree / RANK).mkdir(exist_ok=True)
    with open(tree / RANK / "model", "wb") as f:
        for _ in range(size_mib // 8):
            f.write(os.urandom(8 << 20))
    (tree / "inductor_cache" / "ab" / "k.py").write_text("kernel = 1\n")
    return tree


def main() -> None:
    url, options, work = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3])
    tree = work / "tree" / KEY
    settings = Settings(url, storage_options=options)
    artifacts = ArtifactStore(settings, CompileSettings(trust_unsigned=True))
    list(artifacts.store.list_objects(""))  # opens the client
    before = _peak_mib()
    start = time.monotonic()
    stored = artifacts.upload(tree, KEY, RANK)
    uploaded = time.monotonic()
    fetched = artifacts.fetch(work / "node" / KEY, KEY, RANK)
    done = time.monotonic()
    print(
        json.dumps(
            {
                "size_mib": (tree / RANK / "model").stat().st_size >> 20,
                "stored": stored,
                "fetched": fetched.reason,
                "peak_rss_before_mib": before,
                "peak_rss_after_mib": _peak_mib(),
                "upload_s": uploaded - start,
                "fetch_install_s": done - uploaded,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
