"""Peak memory of one node storing, then fetching and installing, a large compile artifact
(run as its own process, so that its peak RSS is the client's alone).

usage: python -m benchmarks.artifact_memory URL OPTIONS_JSON SIZE_MIB WORKDIR
Prints one JSON line: the peak RSS before and after, and the seconds each step took.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

from plancache.artifacts.share import ArtifactStore, CompileSettings
from plancache.config import Settings

KEY, RANK = "f" * 64, "rank_0_0"


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    url, options, size_mib, work = (
        sys.argv[1],
        json.loads(sys.argv[2]),
        int(sys.argv[3]),
        sys.argv[4],
    )
    tree = Path(work) / "tree" / KEY
    (tree / "inductor_cache" / "ab").mkdir(parents=True, exist_ok=True)
    (tree / RANK).mkdir(exist_ok=True)
    with open(tree / RANK / "model", "wb") as f:  # incompressible, written in 8 MiB blocks
        for _ in range(size_mib // 8):
            f.write(os.urandom(8 << 20))
    (tree / "inductor_cache" / "ab" / "k.py").write_text("kernel = 1\n")
    settings = Settings(url, storage_options=options)
    artifacts = ArtifactStore(settings, CompileSettings(trust_unsigned=True))
    before = _peak_mib()
    start = time.monotonic()
    stored = artifacts.upload(tree, KEY, RANK)
    uploaded = time.monotonic()
    fetched = artifacts.fetch(Path(work) / "node" / KEY, KEY, RANK)
    done = time.monotonic()
    print(
        json.dumps(
            {
                "size_mib": size_mib,
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
