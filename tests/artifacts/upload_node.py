"""A node that uploads one synthetic artifact to a store, in its own process.

usage: upload_node.py URL OPTIONS_JSON TREE [--stall-after BYTES | --pause-at-end SECONDS]
Prints ``created`` or ``kept``. ``--stall-after`` prints ``stalled`` once that many bytes of
the stream were handed to the store, then sleeps (the test kills it there: mid-stream).
``--pause-at-end`` waits that long before the stream's end (before the upload completes).
Run with the checkout's root on the path.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from plancache import open_store
from plancache._artifacts.packing import pack
from tests.artifacts.helpers import KEY, RANK


def main() -> None:
    url, options, tree = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3])
    option, value = (sys.argv[4], float(sys.argv[5])) if len(sys.argv) > 5 else ("", 0.0)
    stall = int(value) if option == "--stall-after" else None
    manifest, chunks = pack(tree, KEY, RANK, compress=False)

    def stalling(chunks: Iterator[bytes]) -> Iterator[bytes]:
        sent = 0
        for chunk in chunks:
            yield chunk
            sent += len(chunk)
            if stall is not None and sent >= stall:
                print("stalled", flush=True)
                time.sleep(60)
        if option == "--pause-at-end":
            time.sleep(value)

    created = open_store(url, **options).layer.write_object(manifest.name, stalling(chunks))
    print("created" if created else "kept", flush=True)


if __name__ == "__main__":
    main()
