"""Settings from the environment and the store registry."""

from __future__ import annotations

from pathlib import Path

import pytest

from plancache import open_store
from plancache._backends.local import LocalStore
from plancache._config import Settings
from plancache.errors import ConfigError, UnsupportedStoreError


@pytest.mark.default_bounds  # checks the default budget
def test_defaults_follow_vllm_cache_root() -> None:
    s = Settings.from_env({"VLLM_CACHE_ROOT": "/cache"})
    assert (s.url, s.timeout, s.read_only, s.local_tier) == (
        "/cache/startup_plan",
        2.0,
        False,
        None,
    )
    assert isinstance(s.open_store().layer, LocalStore)


def test_remote_url_gets_a_local_tier_by_default() -> None:
    env = {"VLLM_CACHE_ROOT": "/cache", "PLANCACHE_URL": "s3://b/p"}
    assert Settings.from_env(env).local_tier == "/cache/startup_plan"
    assert Settings.from_env(env | {"PLANCACHE_LOCAL_TIER": "0"}).local_tier is None
    assert Settings.from_env(env | {"PLANCACHE_LOCAL_TIER": "/t"}).local_tier == "/t"


def test_values_are_parsed() -> None:
    s = Settings.from_env(
        {
            "PLANCACHE_TIMEOUT": "0.75",
            "PLANCACHE_READ_ONLY": "yes",
            "PLANCACHE_STORAGE_OPTIONS": '{"anon": true}',
        }
    )
    assert (s.timeout, s.read_only, dict(s.storage_options)) == (0.75, True, {"anon": True})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PLANCACHE_TIMEOUT", "soon"),
        ("PLANCACHE_TIMEOUT", "0"),
        ("PLANCACHE_TIMEOUT", "inf"),
        ("PLANCACHE_TIMEOUT", "nan"),
        ("PLANCACHE_READ_ONLY", "maybe"),
        ("PLANCACHE_STORAGE_OPTIONS", "{"),
        ("PLANCACHE_STORAGE_OPTIONS", "[1]"),
    ],
)
def test_bad_values_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        Settings.from_env({name: value})


def test_secrets_never_appear_in_repr() -> None:
    s = Settings.from_env(
        {
            "PLANCACHE_URL": "s3://b/p",
            "PLANCACHE_STORAGE_OPTIONS": '{"secret": "hunter2", "key": "AKIA1",'
            ' "client_kwargs": {"aws_session_token": "tok"}, "endpoint_url": "http://x"}',
        }
    )
    text = repr(s)
    assert "hunter2" not in text and "AKIA1" not in text and "tok'" not in text
    assert "http://x" in text


def test_registry_opens_local_paths_and_file_urls(tmp_path: Path) -> None:
    assert open_store(str(tmp_path)).url == str(tmp_path)
    assert open_store(f"file://{tmp_path}").url == str(tmp_path)
    with pytest.raises(UnsupportedStoreError, match="remote host"):
        open_store("file://elsewhere/x")
    with pytest.raises(UnsupportedStoreError, match="no storage options"):
        open_store(str(tmp_path), anon=True)


def test_unknown_scheme_names_the_supported_ones() -> None:
    with pytest.raises(UnsupportedStoreError, match=r"unknown store scheme 'nope'.*gs://.*s3://"):
        open_store("nope://bucket")


def test_credentials_in_the_url_never_appear_in_repr() -> None:
    s = Settings.from_env({"PLANCACHE_URL": "s3://AKIA9:hunter2@bucket/plans"})
    assert "hunter2" not in repr(s) and "AKIA9" not in repr(s)
    assert "s3://bucket/plans" in repr(s)
