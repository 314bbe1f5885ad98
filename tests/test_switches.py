"""Which kinds the plugin shares, and every setting that turns one off, named."""

from __future__ import annotations

import pytest

from plancache._switches import kinds, triton_on

ON = {"PLANCACHE_URL": "s3://b/p"}


@pytest.mark.parametrize(
    ("env", "plans", "compiled", "named"),
    [
        (ON, True, True, "on, with model info"),
        ({}, False, False, "neither PLANCACHE_URL nor VLLM_ENABLE_STARTUP_PLAN"),
        ({**ON, "PLANCACHE_ENABLE": "0"}, False, False, "PLANCACHE_ENABLE=0"),
        ({**ON, "PLANCACHE_COMPILE_CACHE": "0"}, True, False, "PLANCACHE_COMPILE_CACHE=0"),
        ({**ON, "PLANCACHE_COMPILE_CACHE": "maybe"}, True, False, "PLANCACHE_COMPILE_CACHE"),
        ({**ON, "VLLM_USE_AOT_COMPILE": "0"}, True, False, "VLLM_USE_AOT_COMPILE=0"),
        ({**ON, "VLLM_DISABLE_COMPILE_CACHE": "1"}, True, False, "VLLM_DISABLE_COMPILE_CACHE=1"),
        ({**ON, "VLLM_USE_AOT_COMPILE": "1"}, True, True, "on"),
        ({**ON, "VLLM_PLUGINS": "other,x"}, False, False, "VLLM_PLUGINS=other,x"),
        ({"VLLM_ENABLE_STARTUP_PLAN": "1"}, True, True, "on"),
    ],
)
def test_every_off_switch_is_named(
    env: dict[str, str], plans: bool, compiled: bool, named: str
) -> None:
    (p_kind, p_on, p_why), (c_kind, c_on, c_why) = kinds(env)
    assert (p_kind, c_kind) == ("plans", "compile artifacts")
    assert (p_on, c_on) == (plans, compiled), (p_why, c_why)
    assert named in (c_why if plans else p_why + c_why)


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        (ON, True),
        ({**ON, "PLANCACHE_TRITON_CACHE": "0"}, False),
        ({"PLANCACHE_TRITON_CACHE": "1"}, True),
        ({**ON, "PLANCACHE_COMPILE_CACHE": "0"}, False),
        ({**ON, "PLANCACHE_COMPILE_CACHE": "0", "PLANCACHE_TRITON_CACHE": "1"}, True),
        ({**ON, "PLANCACHE_ENABLE": "0"}, True),  # the vLLM plugin's switch, not Triton's
        ({**ON, "PLANCACHE_URL": ""}, False),
        ({**ON, "PLANCACHE_TRITON_CACHE": "maybe"}, False),
        ({**ON, "PLANCACHE_COMPILE_CACHE": "maybe"}, False),
    ],
)
def test_triton_cache_switch(env: dict[str, str], on: bool) -> None:
    assert triton_on(env) is on
