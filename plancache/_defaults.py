"""The one table of settings and bounds (pure, and cheap to import: the vLLM plugin reads its
switches from it in every process vLLM starts).

``SETTINGS``: every ``PLANCACHE_*`` variable, with its type, default, parser and one line of
doc; a reader takes its value with ``Setting.read``. ``BOUNDS``: every internal time bound and
clock-skew allowance, each a module constant here that its users import. The README's
settings table and the bounds table of docs/configuration.md are generated from these two
(``python -m benchmarks.figures --write``; ``tests/test_figures.py`` fails when they differ).
Also: the parsers of setting values, and where plans live locally (``default_dir``).
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from plancache.errors import ConfigError

T = TypeVar("T")

TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class Bound:
    """An internal time bound: its constant's name, value, unit and what it bounds."""

    name: str
    value: float
    unit: str
    doc: str


BOUNDS: list[Bound] = []
"""Every internal time bound and clock-skew allowance, in the order declared."""


def _bound(name: str, value: float, doc: str, unit: str = "s") -> float:
    """``value``, entered in ``BOUNDS`` as the constant ``name``."""
    BOUNDS.append(Bound(name, value, unit, doc))
    return value


# -- the bounds ------------------------------------------------------------------------------
MAX_SECONDS = _bound(
    "MAX_SECONDS",
    600.0,
    "largest time bound a setting, a storage option or `--timeout` may give (a larger one is "
    "a mistake that would make every call fail or hang); a command's default `--timeout`",
)
DEFAULT_BUDGET_S = _bound(
    "DEFAULT_BUDGET_S", 2.0, "one `PlanCache.lookup` or `record` in all (`PLANCACHE_TIMEOUT`)"
)
PUT_BUDGET_S = _bound(
    "PUT_BUDGET_S",
    30.0,
    "a write's compare-and-swap loop losing races: longer than the record budget on purpose "
    "(a boot never waits for its save; 64 writers racing on one key of moto on 2 cores need "
    "up to 3 s)",
)
RECORD_EXIT_WAIT_S = _bound(
    "RECORD_EXIT_WAIT_S",
    10.0,
    "a process's exit waiting, in all, for records still being written past their budget",
)
OPEN_TIMEOUT_S = _bound(
    "OPEN_TIMEOUT_S", 5.0, "one use of a `LazyStore` waiting for its remote store to open"
)
CONNECT_S = _bound(
    "CONNECT_S", 0.5, "one HTTP attempt's connect (storage option `connect_timeout`)"
)
READ_S = _bound("READ_S", 1.0, "one HTTP attempt's read (storage option `read_timeout`)")
CALL_S = _bound("CALL_S", 3.0, "one store call, retries included (storage option `timeout`)")
UPLOAD_CALL_S = _bound(
    "UPLOAD_CALL_S",
    120.0,
    "one part of a streamed write, and completing it (`CALL_S` is sized for records)",
)
STALE_TEMP_SECONDS = _bound(
    "STALE_TEMP_SECONDS", 3600.0, "age past which a write's temp file is a killed writer's leftover"
)
STALE_INSTALL_S = _bound(
    "STALE_INSTALL_S",
    3600.0,
    "age past which an install's temp directory is a killed boot's leftover (a live install "
    "takes seconds to minutes)",
)
PROBE_TIMEOUT_S = _bound("PROBE_TIMEOUT_S", 10.0, "a conformance probe in all; past it, no verdict")
STREAM_MIN_S = _bound(
    "STREAM_MIN_S", 5.0, "what must be left of the probe's bound for `stream-create-existing`"
)
PROBE_JITTER_S = _bound(
    "PROBE_JITTER_S",
    2.0,
    "most a round started when a store is warmed waits first (spread over a rollout)",
)
PROBE_CLAIM_S = _bound(
    "PROBE_CLAIM_S",
    20.0,
    "a probe claim's life (the probe's bound, then the verdict's share and the claim's "
    "release): a prober that dies blocks the fleet's probes this long",
)
REREAD_S = _bound(
    "REREAD_S",
    1.0,
    "before a node without the probe claim first re-reads the shared verdict (then 2 s, 4 s)",
)
RETRY_MIN_S = _bound(
    "RETRY_MIN_S",
    10.0,
    "most before the next round after a first `unknown` (jittered down to half, doubling)",
)
RETRY_S = _bound("RETRY_S", 60.0, "most before the next round after `unknown`; after `read-only`")
WRITE_PATIENCE_S = _bound(
    "WRITE_PATIENCE_S", 300.0, "a write waiting for the conformance probe's verdict"
)
VERDICT_TTL_S = _bound(
    "VERDICT_TTL_S",
    86400.0,
    "an `honest` or `lies` verdict trusted before the store is probed again",
)
DEFAULT_FETCH_S = _bound(
    "DEFAULT_FETCH_S", 60.0, "a compile-artifact fetch in all (`PLANCACHE_COMPILE_TIMEOUT`)"
)
DEFAULT_EXIT_WAIT_S = _bound(
    "DEFAULT_EXIT_WAIT_S",
    30.0,
    "an upload in flight delaying the process's exit (`PLANCACHE_COMPILE_EXIT_WAIT`)",
)
MIN_PACE_S = _bound(
    "MIN_PACE_S", 1.0, "a fetch streaming before its pace may give it up (a rate needs a sample)"
)
JOIN_S = _bound(
    "JOIN_S",
    1.0,
    "a boot at its first forward waiting for a fetch that has not begun to stream",
)
FIRST_ANSWER_S = _bound(
    "FIRST_ANSWER_S",
    5.0,
    "from a fetch's start, for a store to begin streaming, however quickly the weights loaded",
)
POLL_S = _bound(
    "POLL_S", 0.05, "how often a boot waiting for a fetch looks whether it began to stream"
)
CLAIM_BASE_S = _bound(
    "CLAIM_BASE_S", 120.0, "an upload claim's life, plus the object's size at `CLAIM_BYTES_PER_S`"
)
CLAIM_BYTES_PER_S = _bound(
    "CLAIM_BYTES_PER_S", float(1 << 20), "the rate a claim's life allows for (a slow uplink)", "B/s"
)
MAX_AGE_S = _bound(
    "MAX_AGE_S", 7 * 86400.0, "age past which crash marks are removed (the node forgets a crash)"
)
CLOCK_SKEW_S = _bound(
    "CLOCK_SKEW_S",
    300.0,
    "how far another node's clock may run ahead of this one's: an upload claim, a shared "
    "verdict or a kind's object dated later than that is disbelieved (a planted far-future "
    "date would otherwise block uploads, pin a verdict or hide the newest objects)",
)
TOMBSTONE_SKEW_S = _bound(
    "TOMBSTONE_SKEW_S",
    86400.0,
    "how far ahead a tombstone's `retracted_at` may lie: wider than `CLOCK_SKEW_S` on "
    "purpose, since a retraction disbelieved brings back an observation whose boot crashed, "
    "while a later one is dropped so that a planted year-9999 date cannot outrank every real "
    "retraction for good",
)
DOCTOR_SKEW_S = _bound(
    "DOCTOR_SKEW_S",
    60.0,
    "a clock this far from the store's is a `doctor` finding: well inside `CLOCK_SKEW_S`, so "
    "a node hears of its clock before others disbelieve what it writes (prune and crash-mark "
    "ages go wrong by as much)",
)

CLOCK_WAIT_S = _bound(
    "CLOCK_WAIT_S",
    3.0,
    "how long `doctor`'s clock check waits for the endpoint where the store declares no call bound",
)


# -- the parsers -----------------------------------------------------------------------------
def parse_bool(name: str, value: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (case-insensitive); else ``ConfigError``."""
    v = value.strip().lower()
    if v in TRUE_WORDS:
        return True
    if v in FALSE_WORDS:
        return False
    raise ConfigError(f"{name}={value!r}: expected 1/0, true/false, yes/no or on/off")


def parse_switch(name: str, value: str) -> bool | None:
    """``parse_bool``, but blank is None: the switch is not set and others decide."""
    return parse_bool(name, value) if value.strip() else None


def parse_seconds(text: str) -> float:
    """``text`` as a number of seconds in (0, ``MAX_SECONDS``], the range of every time
    setting (``PLANCACHE_TIMEOUT``, ``plancache --timeout``); else ``ConfigError`` saying
    what is expected."""
    try:
        t = float(text)
    except ValueError:
        raise ConfigError("expected seconds as a number") from None
    if not (math.isfinite(t) and 0 < t <= MAX_SECONDS):
        raise ConfigError(f"expected a positive number of seconds, at most {MAX_SECONDS:g}")
    return t


def parse_timeout(name: str, value: str) -> float:
    """Variable ``name``'s ``value`` as seconds (``parse_seconds``); else ``ConfigError``
    naming it."""
    try:
        return parse_seconds(value)
    except ConfigError as exc:
        raise ConfigError(f"{name}={value!r}: {exc}") from None


def parse_bytes(name: str, value: str) -> int:
    """A positive number of bytes; else ``ConfigError`` naming ``name``."""
    size = value.strip()
    if not size.isdigit() or int(size) <= 0:
        raise ConfigError(f"{name}={size!r}: expected bytes (> 0)")
    return int(size)


def parse_storage_options(text: str, source: str) -> dict[str, Any]:
    """A JSON object of storage options from ``source`` (a variable or flag name); else
    ``ConfigError``. The text itself is never echoed: it may hold secrets. (``orjson`` is
    imported here: a process that reads no storage options, vLLM's with the plugin off, never
    loads it.)"""
    import orjson

    try:
        options = orjson.loads(text) if text.strip() else {}
    except orjson.JSONDecodeError:
        raise ConfigError(f"{source} is not valid JSON") from None
    if not isinstance(options, dict):
        raise ConfigError(f"{source} must be a JSON object")
    return options


def parse_text(name: str, value: str) -> str | None:
    """The text as given; blank is None (not set)."""
    return value if value.strip() else None


# -- the settings ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting(Generic[T]):
    """A ``PLANCACHE_*`` variable: ``parse(name, text)`` gives its value (``ConfigError``
    naming it for a malformed one), ``default`` where it is not set."""

    name: str
    type: str
    default: T
    parse: Callable[[str, str], T]
    doc: str
    shown: str
    """The default as the README shows it."""

    def read(self, environ: Mapping[str, str] | None = None) -> T:
        """This variable's value in ``environ`` (default: the process's environment); where
        it is not set, a copy of the default (a mutable one is never shared)."""
        text = (os.environ if environ is None else environ).get(self.name)
        return copy.copy(self.default) if text is None else self.parse(self.name, text)


SETTINGS: list[Setting[Any]] = []
"""Every ``PLANCACHE_*`` variable, in the README's order."""


def _setting(
    name: str, type: str, default: T, parse: Callable[[str, str], T], doc: str, shown: str
) -> Setting[T]:
    setting = Setting(name, type, default, parse, doc, shown)
    SETTINGS.append(setting)
    return setting


URL = _setting(
    "PLANCACHE_URL",
    "URL or path",
    None,
    parse_text,
    "store URL (`s3://`, `gs://`, `file://`, `memory://`, ...) or local path",
    "`{VLLM_CACHE_ROOT or $XDG_CACHE_HOME/vllm or ~/.cache/vllm}/startup_plan`",
)
TIMEOUT = _setting(
    "PLANCACHE_TIMEOUT",
    "seconds",
    DEFAULT_BUDGET_S,
    parse_timeout,
    "seconds a lookup or record may take in all",
    f"`{DEFAULT_BUDGET_S}`",
)
READ_ONLY = _setting(
    "PLANCACHE_READ_ONLY", "boolean", False, parse_bool, "`1`: never write the remote store", "`0`"
)
LOCAL_TIER = _setting(
    "PLANCACHE_LOCAL_TIER",
    "`1`, `0` or a directory",
    "1",
    lambda name, value: value,
    "local tier in front of a remote store: `1`, `0` or a directory",
    "`1` (the default local directory)",
)
STORAGE_OPTIONS: Setting[dict[str, Any]] = _setting(
    "PLANCACHE_STORAGE_OPTIONS",
    "JSON object",
    {},
    lambda name, text: parse_storage_options(text, name),
    "JSON object of storage options for the backend",
    "`{}`",
)
SIGNING_KEY = _setting(
    "PLANCACHE_SIGNING_KEY",
    "key",
    None,
    parse_text,
    "key that signs every record this node writes (16 or more printable ASCII characters, no "
    "spaces or commas: `openssl rand -hex 32`; `#` is a key character here); with any key "
    "set, only validly signed records are applied (see Signed plans in the threat model)",
    "unset",
)
SIGNING_KEY_FILE = _setting(
    "PLANCACHE_SIGNING_KEY_FILE",
    "path",
    None,
    parse_text,
    "a file holding that key, instead of the variable (a regular file of at most 64 KiB; a "
    "word starting with `#` starts a comment to the end of its line)",
    "unset",
)
VERIFY_KEYS = _setting(
    "PLANCACHE_VERIFY_KEYS",
    "keys",
    None,
    parse_text,
    "further keys whose signatures are accepted (rotation), separated by commas or ASCII "
    "whitespace",
    "unset",
)
VERIFY_KEYS_FILE = _setting(
    "PLANCACHE_VERIFY_KEYS_FILE",
    "path",
    None,
    parse_text,
    "a file of such keys, one per line, instead of the variable (as for "
    "`PLANCACHE_SIGNING_KEY_FILE`)",
    "unset",
)
TRUST_PRECONDITIONS = _setting(
    "PLANCACHE_TRUST_PRECONDITIONS",
    "boolean",
    False,
    parse_bool,
    "`1`: write to a remote store without the conformance probe (see Stores that ignore "
    "conditional writes in the stores page), even one found to ignore conditional writes (a "
    "racing write can then be lost); logs a warning at every open",
    "`0`",
)
ENABLE = _setting(
    "PLANCACHE_ENABLE",
    "boolean",
    None,
    parse_switch,
    "vLLM plugin: `0` off whatever else is set, `1` on (with the default store unless "
    "`PLANCACHE_URL` is set)",
    "on when `PLANCACHE_URL` or `VLLM_ENABLE_STARTUP_PLAN=1` is set",
)
COMPILE_CACHE = _setting(
    "PLANCACHE_COMPILE_CACHE",
    "boolean",
    None,
    parse_switch,
    "vLLM plugin: share torch.compile artifacts and vLLM's model-info files, `0` off, `1` on "
    "(see Compile artifacts in the docs)",
    "on where the plugin is on",
)
COMPILE_TRUST_UNSIGNED = _setting(
    "PLANCACHE_COMPILE_TRUST_UNSIGNED",
    "boolean",
    False,
    parse_bool,
    "`1`: with no key configured, install unsigned compile artifacts from a remote store "
    "(loading one executes its code)",
    "`0`",
)
COMPILE_MAX_BYTES = _setting(
    "PLANCACHE_COMPILE_MAX_BYTES",
    "bytes",
    4 << 30,
    parse_bytes,
    "cap on one compile artifact's files; larger ones are neither stored nor installed",
    f"`{4 << 30}` (4 GiB)",
)
COMPILE_TIMEOUT = _setting(
    "PLANCACHE_COMPILE_TIMEOUT",
    "seconds",
    DEFAULT_FETCH_S,
    parse_timeout,
    "seconds a compile-artifact fetch may take in all (the store's opening included; a store "
    f"call in flight ends within the store's own per-call bound, {CALL_S:g} s on S3 and GCS); "
    "past it, or as soon as its rate cannot beat the producer's compile time, the node compiles",
    f"`{DEFAULT_FETCH_S:g}`",
)
METRICS = _setting(
    "PLANCACHE_METRICS",
    "boolean",
    True,
    parse_bool,
    "`0`: no Prometheus metrics (see Metrics in the vLLM plugin page; they need "
    "`prometheus_client`, which vLLM installs)",
    "`1`",
)
EVENTS = _setting(
    "PLANCACHE_EVENTS",
    "boolean",
    False,
    parse_bool,
    "`1`: every process writes each decision as one JSON line on standard error "
    "(`plancache-event {...}`, see Events in the library page)",
    "`0`",
)
COMPILE_EXIT_WAIT = _setting(
    "PLANCACHE_COMPILE_EXIT_WAIT",
    "seconds",
    DEFAULT_EXIT_WAIT_S,
    parse_timeout,
    "seconds an upload in flight may delay the process's exit; then it is abandoned and "
    "nothing is stored",
    f"`{DEFAULT_EXIT_WAIT_S:g}`",
)
TRITON_CACHE = _setting(
    "PLANCACHE_TRITON_CACHE",
    "boolean",
    None,
    parse_switch,
    "Triton cache manager (`TRITON_CACHE_MANAGER=plancache.integrations.triton:CacheManager`, "
    "see Generated caches in the docs): `1` shares Triton's cache, `0` leaves it Triton's "
    "plain file cache",
    "on where `PLANCACHE_URL` is set and `PLANCACHE_COMPILE_CACHE` is not `0`",
)


def _number(value: float) -> str:
    """``value`` as written: a whole number without a point (no exponent), another exactly."""
    return f"{value:.0f}" if value.is_integer() else repr(value)


def tables() -> dict[str, str]:
    """The README's settings table (``settings``) and docs/configuration.md's bounds table
    (``bounds``), as Markdown between blank lines."""
    settings = ["| variable | type | meaning | default |", "|---|---|---|---|"]
    settings += [f"| `{s.name}` | {s.type} | {s.doc} | {s.shown} |" for s in SETTINGS]
    bounds = ["| constant | value | what it bounds |", "|---|---|---|"]
    bounds += [f"| `{b.name}` | {_number(b.value)} {b.unit} | {b.doc} |" for b in BOUNDS]
    return {
        name: "\n\n" + "\n".join(rows) + "\n\n"
        for name, rows in [("settings", settings), ("bounds", bounds)]
    }


EXPLAIN_DIR = "explain"
"""Below a node's local directory: the factors of its recent misses (the vLLM plugin writes
them), for ``plancache explain``."""


def default_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``{VLLM_CACHE_ROOT or $XDG_CACHE_HOME/vllm or ~/.cache/vllm}/startup_plan``: where vLLM
    keeps its own plans."""
    env = os.environ if environ is None else environ
    root = env.get("VLLM_CACHE_ROOT") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vllm"
    )
    return Path(os.path.expanduser(root)) / "startup_plan"
