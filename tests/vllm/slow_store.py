"""A store with latency: S3 (moto, in this process) behind a loopback proxy that delays every
request (needs ``moto[server]``; the clients need ``s3fs``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from plancache.testing.servers import s3_server, with_latency


@contextmanager
def slow_s3(delay_s: float) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(url, storage_options)`` of a fresh S3 bucket whose every request takes ``delay_s``
    longer."""
    with s3_server() as spec, with_latency(spec, delay_s) as slow:
        yield slow
