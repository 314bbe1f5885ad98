"""A store with latency: S3 (moto, in this process) behind a loopback proxy that delays every
request (needs ``moto[server]``; the clients need ``s3fs``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from plancache.testing.servers import CountingProxy, s3_server


class DelayingProxy(CountingProxy):
    """``CountingProxy`` that waits ``delay_s`` before forwarding each request."""

    def __init__(self, upstream: str, delay_s: float) -> None:
        super().__init__(upstream)
        self.delay_s = delay_s

    def handle(self, h: Any) -> None:
        time.sleep(self.delay_s)
        super().handle(h)


@contextmanager
def slow_s3(delay_s: float) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(url, storage_options)`` of a fresh S3 bucket whose every request takes ``delay_s``
    longer."""
    with s3_server() as (url, options), DelayingProxy(options["endpoint_url"], delay_s) as proxy:
        yield url, {**options, "endpoint_url": proxy.endpoint}
