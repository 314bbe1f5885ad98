"""Secrets are masked in options, messages and URLs."""

from __future__ import annotations

import traceback

from plancache._redaction import (
    MASK,
    redact,
    scrub,
    scrub_exception,
    secret_values,
    without_userinfo,
)

OPTIONS = {
    "endpoint_url": "http://127.0.0.1:9000",
    "key": "AKIAEXAMPLE",
    "secret": "wJalrXUtnFEMI",
    "token": "abc",
    "client_kwargs": {"region_name": "us-east-1", "aws_secret_access_key": "nested-secret"},
    "session_kwargs": {"headers": {"X-Goog-Api-Key": "api-key-value"}},
    "retries": 1,
}


def test_redact_masks_secret_looking_keys_at_any_depth() -> None:
    assert redact(OPTIONS) == {
        "endpoint_url": "http://127.0.0.1:9000",
        "key": MASK,
        "secret": MASK,
        "token": MASK,
        "client_kwargs": {"region_name": "us-east-1", "aws_secret_access_key": MASK},
        "session_kwargs": {"headers": {"X-Goog-Api-Key": MASK}},
        "retries": 1,
    }
    assert OPTIONS["key"] == "AKIAEXAMPLE"  # the caller's options are left alone


def test_secret_values_skip_short_ones_and_scrub_masks_them() -> None:
    secrets = sorted(secret_values(OPTIONS))
    assert secrets == sorted(["AKIAEXAMPLE", "wJalrXUtnFEMI", "nested-secret", "api-key-value"])
    message = "denied for AKIAEXAMPLE with wJalrXUtnFEMI (nested-secret) at 127.0.0.1"
    assert scrub(message, secrets) == f"denied for {MASK} with {MASK} ({MASK}) at 127.0.0.1"


def test_without_userinfo() -> None:
    assert without_userinfo("sftp://user:pw@host/path/x") == "sftp://host/path/x"
    assert without_userinfo("s3://bucket/p") == "s3://bucket/p"
    assert without_userinfo("s3://bucket") == "s3://bucket"
    assert without_userinfo("/local/a@b") == "/local/a@b"


def test_scrub_exception_masks_an_os_errors_text_and_its_causes() -> None:
    """An ``OSError`` with an errno is printed from its strerror and file names, not its
    args: each is scrubbed, and so is every exception it was raised from."""
    secret = "wJalrXUtnFEMI"
    try:
        try:
            raise OSError(13, f"denied for {secret}", f"/keys/{secret}", None, f"/b/{secret}")
        except OSError as inner:
            raise RuntimeError(f"store {secret}") from inner
    except RuntimeError as exc:
        scrubbed = scrub_exception(exc, [secret])
    text = "".join(traceback.format_exception(scrubbed))
    assert secret not in text
    assert f"[Errno 13] denied for {MASK}: '/keys/{MASK}' -> '/b/{MASK}'" in text
    assert isinstance(scrubbed.__cause__, OSError) and scrubbed.__cause__.errno == 13
