"""The ``plancache`` command: see what a store holds, check it, copy it and prune it.

Every subcommand opens the store it names (or ``PLANCACHE_URL``) directly, without the local
tier, so what it shows is what that store itself holds. Expected failures print one line,
``plancache: error: ...``, and exit 2; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO, TypeVar

import orjson

from plancache import __version__
from plancache.backends import open_store
from plancache.backends.local import LocalStore
from plancache.config import Settings, is_remote
from plancache.errors import InvalidPlanError, PlanStoreError, UnsupportedSchemaError
from plancache.fingerprint import fingerprint
from plancache.plan import Plan, canonical
from plancache.redaction import redact
from plancache.store import PlanStore

T = TypeVar("T")
GIB = float(1 << 30)
DEVICE_FACTOR = "device_name"
"""The factor naming the device a plan was recorded on (the vLLM plugin records it)."""
WORKERS = 8
"""Threads reading or writing records at once (store I/O is latency bound)."""
PROGRESS_MIN = 20
"""Copies of more plans than this show a progress bar when stderr is a terminal."""
EXPECTED_ERRORS = (PlanStoreError, ValueError, OSError)
"""Failures reported as one line and exit 2 (ConfigError and InvalidPlanError are ValueErrors)."""

_PREFIX = re.compile(r"[0-9a-f]{1,64}")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DEBUG_HELP = "show the traceback of an error"
_OPTIONS_HELP = "storage options as a JSON object (default: $PLANCACHE_STORAGE_OPTIONS)"
_URL_HELP = "store URL or local path (default: $PLANCACHE_URL)"
_SORT_HELP = "age: newest first; kv, baseline: largest first; device, fp: A-Z (default: age)"


class CliError(ValueError):
    """A problem found after parsing: unknown prefix, missing store, unreadable input."""


@dataclass(frozen=True)
class Entry:
    """One stored record as read: the plan, or why the record is invalid."""

    fingerprint: str
    raw: bytes
    plan: Plan | None
    error: str | None = None
    other_schema: bool = False
    """A record of another schema version: not this version's to judge or delete."""


# -- shared helpers ----------------------------------------------------------------------------
def parse_duration(text: str) -> float:
    """``30d``, ``12h``, ``45m`` or ``10s`` as seconds (argparse type)."""
    match = _DURATION.fullmatch(text.strip().lower())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30d, 12h, 45m or 10s")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _parse_options(text: str, source: str) -> dict[str, Any]:
    """A JSON object of storage options; the text itself is never echoed (it may hold secrets)."""
    try:
        options = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise CliError(f"{source} is not valid JSON") from None
    if not isinstance(options, dict):
        raise CliError(f"{source} must be a JSON object")
    return options


def _open(
    args: argparse.Namespace,
    url: str | None,
    options: str | None = None,
    *,
    flag: str = "--storage-options",
    must_exist: bool = True,
    shared_for_local: bool = True,
) -> PlanStore:
    """Open ``url`` (default: ``PLANCACHE_URL``) with ``options`` (the JSON given to ``flag``),
    else ``--storage-options`` (unless ``shared_for_local`` is False and the store is local),
    else, for a remote store, those of the environment; ``main`` closes it. A local store
    that must exist but does not is an error."""
    settings = Settings.from_env() if url is None else None
    url = settings.url if settings is not None else url
    assert url is not None
    if options is None and (shared_for_local or is_remote(url)):
        options, flag = args.storage_options, "--storage-options"
    storage_options: dict[str, Any] = {}
    if options is not None:
        storage_options = _parse_options(options, flag)
    elif is_remote(url):
        storage_options = dict((settings or Settings.from_env()).storage_options)
    store = open_store(url, **storage_options)
    args.opened.append(store)
    if must_exist and isinstance(store, LocalStore) and not store.root.exists():
        raise CliError(f"{store.url}: no store there (the directory does not exist)")
    return store


def _secret_values(options: Mapping[str, Any]) -> Iterator[str]:
    """The values of secret-looking storage options, to keep them out of error messages."""
    masked = redact(options)
    for key, value in options.items():
        if isinstance(value, Mapping):
            yield from _secret_values(value)
        elif masked.get(key) == "***" and len(str(value)) >= 4:  # shorter ones: no secret
            yield str(value)


def _scrub(message: str, args: argparse.Namespace) -> str:
    """``message`` with every secret of the command's storage options masked."""
    texts = [os.environ.get("PLANCACHE_STORAGE_OPTIONS")]
    texts += [getattr(args, name, None) for name in ("storage_options", "src_opts", "dst_opts")]
    for text in texts:
        try:
            options = orjson.loads(text) if text else None
        except orjson.JSONDecodeError:
            continue
        if isinstance(options, dict):
            for secret in _secret_values(options):
                message = message.replace(secret, "***")
    return message


def _parallel(
    func: Callable[[str], T], items: Sequence[str], progress: Progress | None = None
) -> list[T]:
    """``func`` over ``items`` on a few threads, results in order; the first failure is
    raised at once and the work not yet started is cancelled."""
    pool = ThreadPoolExecutor(max_workers=WORKERS)
    try:
        futures = [pool.submit(func, item) for item in items]
        for done, future in enumerate(as_completed(futures), 1):
            future.result()
            if progress is not None:
                progress.update(done)
        return [future.result() for future in futures]
    finally:
        pool.shutdown(cancel_futures=True)


def _read_entry(store: PlanStore, fp: str) -> Entry | None:
    """The record under ``fp``, checked against every rule of the format; None if gone."""
    raw = store.read_raw(fp)
    if raw is None:
        return None
    try:
        return Entry(fp, raw, Plan.decode(raw, expected_fingerprint=fp))
    except InvalidPlanError as exc:
        return Entry(fp, raw, None, str(exc), isinstance(exc, UnsupportedSchemaError))


def _scan(store: PlanStore) -> list[Entry]:
    """Every record in ``store``, in fingerprint order."""
    fps = sorted(store.iter_fingerprints())
    return [e for e in _parallel(lambda fp: _read_entry(store, fp), fps) if e is not None]


def _resolve(store: PlanStore, prefixes: Sequence[str]) -> list[str]:
    """The stored fingerprints that ``prefixes`` name, each uniquely; else ``CliError``."""
    wanted = [p.strip().lower() for p in prefixes]
    for prefix in wanted:
        if not _PREFIX.fullmatch(prefix):
            raise CliError(f"not a fingerprint or a prefix of one (hex digits): {prefix!r:.80}")
    known = sorted(store.iter_fingerprints())
    found: list[str] = []
    for prefix in wanted:
        matches = [fp for fp in known if fp.startswith(prefix)]
        if not matches:
            raise CliError(f"no plan matches {prefix!r} in {store.url}")
        if len(matches) > 1:
            shown = ", ".join(m[:12] for m in matches[:4])
            raise CliError(
                f"{prefix!r} is ambiguous in {store.url}: it matches {len(matches)} plans "
                f"({shown}{', ...' if len(matches) > 4 else ''}); give more digits"
            )
        found.append(matches[0])
    return list(dict.fromkeys(found))


def _device(plan: Plan) -> str:
    value = plan.factors.get(DEVICE_FACTOR)
    return "-" if value is None else str(value)


def _host(plan: Plan) -> str:
    return str(plan.newest.producer.get("host", "-"))


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _gib(n: int) -> str:
    return f"{n / GIB:.2f}"


def _age(seconds: float) -> str:
    """``45s``, ``12m``, ``5h``, ``30d``: the largest whole unit."""
    if seconds < 0:
        return "future"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _when(ts: float, now: float) -> str:
    stamp = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{stamp} ({_age(now - ts)} ago)"


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = n / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def _print_json(data: object) -> None:
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")


def _print_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> None:
    """Aligned columns; the columns in ``right`` are right-aligned (numbers)."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    for row in [headers, *rows]:
        cells = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())


class Progress:
    """A one-line progress bar on a terminal, redrawn at most every 0.1 s."""

    def __init__(self, total: int, stream: TextIO, label: str) -> None:
        self.total, self.stream, self.label = total, stream, label
        self._last = 0.0

    def update(self, done: int) -> None:
        now = time.monotonic()
        if done < self.total and now - self._last < 0.1:
            return
        self._last = now
        filled = 30 * done // self.total
        bar = "#" * filled + "." * (30 - filled)
        end = "\n" if done == self.total else ""
        self.stream.write(f"\r{self.label} [{bar}] {done}/{self.total}{end}")
        self.stream.flush()


# -- subcommands -------------------------------------------------------------------------------
SORT_KEYS: dict[str, Callable[[Plan], Any]] = {
    "age": lambda p: -p.created_at,
    "kv": lambda p: -p.kv_cache_memory_bytes,
    "baseline": lambda p: -p.free_memory_baseline,
    "device": _device,
    "fp": lambda p: p.fingerprint,
}


def cmd_ls(args: argparse.Namespace) -> int:
    """One row per plan; invalid records listed after them, with the reason."""
    store = _open(args, args.url)
    entries = _scan(store)
    sort_key = SORT_KEYS[args.sort]
    valid = sorted(
        ((e.plan, e) for e in entries if e.plan is not None), key=lambda pe: sort_key(pe[0])
    )
    invalid = [e for e in entries if e.plan is None]
    now = time.time()
    if args.json:
        _print_json([_entry_json(e, now) for e in [e for _, e in valid] + invalid])
        return 0
    rows = [
        [
            p.fingerprint[:12],
            _device(p),
            _gib(p.kv_cache_memory_bytes),
            _gib(p.free_memory_baseline),
            _age(now - p.created_at),
            _host(p),
        ]
        for p, _ in valid
    ]
    if rows:
        headers = ["FINGERPRINT", "DEVICE", "KV GiB", "BASELINE GiB", "AGE", "HOST"]
        _print_table(headers, rows, right={2, 3, 4})
    if invalid:
        print("invalid records (never applied; `plancache verify --fix` deletes them):")
        for e in invalid:
            print(f"  {e.fingerprint[:12]}  {e.error}")
    print(f"{_n(len(valid), 'plan')}, {len(invalid)} invalid, in {store.url}")
    return 0


def _entry_json(e: Entry, now: float) -> dict[str, Any]:
    if e.plan is None:
        return {"fingerprint": e.fingerprint, "valid": False, "error": e.error, "bytes": len(e.raw)}
    p = e.plan
    return {
        "fingerprint": p.fingerprint,
        "valid": True,
        "device": _device(p),
        "kv_cache_memory_bytes": p.kv_cache_memory_bytes,
        "free_memory_baseline": p.free_memory_baseline,
        "created_at": p.created_at,
        "age_seconds": now - p.created_at,
        "producer": dict(p.newest.producer),
        "bytes": len(e.raw),
    }


def cmd_show(args: argparse.Namespace) -> int:
    """The whole record under a fingerprint or a unique prefix of one."""
    store = _open(args, args.url)
    [fp] = _resolve(store, [args.fingerprint])
    entry = _read_entry(store, fp)
    if entry is None:
        raise CliError(f"plan {fp} was deleted meanwhile")
    if entry.plan is None:
        sys.stdout.write(entry.raw.decode("utf-8", "replace") + "\n")
        print(f"plancache: invalid record {fp}: {entry.error}", file=sys.stderr)
        return 1
    p = entry.plan
    if args.json:
        _print_json(p.to_dict())
        return 0
    now = time.time()
    width = max(len(k) for k in p.factors) if p.factors else 0
    print(f"fingerprint  {p.fingerprint}")
    print(f"kv cache     {_gib(p.kv_cache_memory_bytes)} GiB ({p.kv_cache_memory_bytes} bytes)")
    print(f"baseline     {_gib(p.free_memory_baseline)} GiB ({p.free_memory_baseline} bytes)")
    print(f"created      {_when(p.created_at, now)}")
    print(
        f"producer     {' '.join(f'{k}={v}' for k, v in sorted(p.newest.producer.items())) or '-'}"
    )
    print(f"store        {store.url}")
    print("factors")
    for key in sorted(p.factors):
        print(f"  {key.ljust(width)}  {orjson.dumps(p.factors[key]).decode()}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Check every record; exit 1 if invalid ones remain (``--fix`` deletes them)."""
    store = _open(args, args.url)
    entries = _scan(store)
    bad = [e for e in entries if e.plan is None and not e.other_schema]
    for e in entries:
        if e.other_schema:
            print(f"{e.fingerprint}  {e.error} (another version's record: kept)")
    deleted = 0
    for e in bad:
        note = ""
        if args.fix:
            again = _read_entry(store, e.fingerprint)  # a writer may have replaced it since
            if again is None or (again.plan is None and not again.other_schema):
                store.delete(e.fingerprint)
                deleted += 1
                note = "  (deleted)"
            else:
                note = "  (now valid, kept)"
        print(f"{e.fingerprint}  {e.error}{note}")
    summary = f"{_n(len(entries), 'record')} checked in {store.url}: {len(bad)} invalid"
    print(summary + (f", {deleted} deleted" if args.fix else ""))
    return 1 if bad and not args.fix else 0


def cmd_rm(args: argparse.Namespace) -> int:
    """Delete plans by fingerprint or unique prefix; every prefix is resolved first."""
    store = _open(args, args.url)
    for fp in _resolve(store, args.fingerprints):
        print(f"deleted {fp}" if store.delete(fp) else f"already gone {fp}")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    """Delete plans recorded longer ago than ``--older-than``, and abandoned temp files."""
    store = _open(args, args.url)
    now = time.time()
    cutoff = now - args.older_than
    entries = _scan(store)
    verb = "would delete" if args.dry_run else "deleted"
    pruned = 0
    for e in entries:
        if e.plan is None or e.plan.created_at >= cutoff:
            continue
        if not args.dry_run:
            again = _read_entry(store, e.fingerprint)  # a newer plan may have replaced it
            if again is None or again.plan is None or again.plan.created_at >= cutoff:
                continue
            store.delete(e.fingerprint)
        pruned += 1
        print(f"{verb} {e.fingerprint}  {_age(now - e.plan.created_at)} old  {_device(e.plan)}")
    summary = f"{verb} {_n(pruned, 'plan')} older than {_age(args.older_than)} in {store.url}"
    if isinstance(store, LocalStore):
        temps = store.remove_stale_temp_files(dry_run=args.dry_run)
        summary += f", and {_n(temps, 'abandoned temp file')}"
    invalid = sum(e.plan is None for e in entries)
    if invalid:
        summary += f"; {_n(invalid, 'invalid record')} left (`plancache verify --fix` deletes them)"
    print(summary)
    return 0


def cmd_cp(args: argparse.Namespace) -> int:
    """Copy every valid plan from SRC into DST with merge semantics (``DST.put``)."""
    # --storage-options serves whichever side is remote; the other may be a local path
    src = _open(args, args.src, args.src_opts, flag="--src-storage-options", shared_for_local=False)
    dst = _open(
        args,
        args.dst,
        args.dst_opts,
        flag="--dst-storage-options",
        must_exist=False,
        shared_for_local=False,
    )
    fps = sorted(src.iter_fingerprints())
    progress = None
    if len(fps) > PROGRESS_MIN and sys.stderr.isatty():
        progress = Progress(len(fps), sys.stderr, "copying")

    def copy(fp: str) -> str:
        entry = _read_entry(src, fp)
        if entry is None:
            return "vanished"
        if entry.plan is None:
            return "invalid"
        return dst.put(entry.plan).value

    counts = Counter(_parallel(copy, fps, progress))
    print(
        f"copied {src.url} -> {dst.url}: {counts['created']} created, "
        f"{counts['replaced']} replaced, {counts['kept']} kept, "
        f"{counts['invalid']} invalid skipped"
        + (f", {counts['vanished']} deleted meanwhile" if counts["vanished"] else "")
    )
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """Counts, bytes, oldest and newest plan, devices seen."""
    store = _open(args, args.url)
    entries = _scan(store)
    plans = [e.plan for e in entries if e.plan is not None]
    created = [p.created_at for p in plans]
    devices = Counter(_device(p) for p in plans)
    stats: dict[str, Any] = {
        "url": store.url,
        "plans": len(plans),
        "invalid": len(entries) - len(plans),
        "bytes": sum(len(e.raw) for e in entries),
        "oldest": min(created, default=None),
        "newest": max(created, default=None),
        "devices": dict(devices.most_common()),
    }
    if args.json:
        _print_json(stats)
        return 0
    now = time.time()
    print(f"store    {store.url}")
    print(f"plans    {stats['plans']} ({stats['invalid']} invalid)")
    print(f"bytes    {_size(stats['bytes'])}")
    print(f"oldest   {_when(stats['oldest'], now) if created else '-'}")
    print(f"newest   {_when(stats['newest'], now) if created else '-'}")
    print(f"devices  {', '.join(f'{d} ({n})' for d, n in devices.most_common()) or '-'}")
    return 0


def cmd_fingerprint(args: argparse.Namespace) -> int:
    """The fingerprint and canonical encoding of a factors object (or of a record's factors)."""
    name = args.factors
    label = "stdin" if name == "-" else name
    try:
        data = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {label}: {exc.strerror or exc}") from None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise CliError(f"{label} is not valid JSON: {exc}") from None
    if isinstance(obj, dict) and {"schema", "fingerprint", "factors"} <= obj.keys():
        obj = obj["factors"]  # a whole plan record, e.g. from `plancache show --json`
    if not isinstance(obj, dict):
        raise CliError(f"{label}: expected a JSON object of factors")
    try:
        encoding = canonical(obj)
    except InvalidPlanError as exc:
        raise CliError(f"{label}: {exc}") from None
    print(fingerprint(obj))
    print(encoding.decode())
    return 0


# -- parser and entry point --------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The ``plancache`` argument parser, one subparser per subcommand."""
    parser = argparse.ArgumentParser(
        prog="plancache",
        description="Inspect and manage stores of vLLM startup plans (local, s3://, gs://).",
        epilog="URL defaults to $PLANCACHE_URL (else the local default directory).",
    )
    parser.add_argument("--version", action="version", version=f"plancache {__version__}")
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    parser.add_argument("--storage-options", metavar="JSON", help=_OPTIONS_HELP)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP)
    common.add_argument(
        "--storage-options", metavar="JSON", default=argparse.SUPPRESS, help=_OPTIONS_HELP
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str, func: Callable[[argparse.Namespace], int], doc: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=doc, description=doc)
        p.set_defaults(func=func)
        return p

    p = command(
        "ls",
        cmd_ls,
        "list the plans in a store, one row each (invalid records too, with the reason)",
    )
    p.add_argument("url", nargs="?", metavar="URL", help=_URL_HELP)
    p.add_argument("--sort", choices=sorted(SORT_KEYS), default="age", help=_SORT_HELP)
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = command(
        "show", cmd_show, "show a whole record, factors included, by fingerprint or unique prefix"
    )
    p.add_argument("fingerprint", metavar="FP", help="a fingerprint or a unique prefix")
    p.add_argument("--url", metavar="URL", help=_URL_HELP)
    p.add_argument("--json", action="store_true", help="the record as stored (JSON)")

    p = command(
        "verify",
        cmd_verify,
        "check every record against the format's rules; exit 1 if any is invalid",
    )
    p.add_argument("url", nargs="?", metavar="URL", help=_URL_HELP)
    p.add_argument("--fix", action="store_true", help="delete the invalid records")

    p = command("rm", cmd_rm, "delete plans by fingerprint or unique prefix")
    p.add_argument("fingerprints", nargs="+", metavar="FP", help="fingerprints or prefixes")
    p.add_argument("--url", metavar="URL", help=_URL_HELP)

    p = command(
        "prune",
        cmd_prune,
        "delete plans older than an age, and abandoned temp files of local stores",
    )
    p.add_argument("url", nargs="?", metavar="URL", help=_URL_HELP)
    p.add_argument(
        "--older-than", type=parse_duration, required=True, metavar="AGE", help="30d, 12h, 45m"
    )
    p.add_argument("--dry-run", action="store_true", help="list what would be deleted")

    p = command("cp", cmd_cp, "copy every valid plan from SRC to DST, merging with what DST holds")
    p.add_argument("src", metavar="SRC", help="store to copy from")
    p.add_argument("dst", metavar="DST", help="store to copy into (created if need be)")
    p.add_argument(
        "--src-storage-options",
        dest="src_opts",
        metavar="JSON",
        help="for SRC (default: --storage-options)",
    )
    p.add_argument(
        "--dst-storage-options",
        dest="dst_opts",
        metavar="JSON",
        help="for DST (default: --storage-options)",
    )

    p = command("stats", cmd_stats, "plan count, bytes, oldest and newest plan, devices seen")
    p.add_argument("url", nargs="?", metavar="URL", help=_URL_HELP)
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = command(
        "fingerprint",
        cmd_fingerprint,
        "print the fingerprint and canonical encoding of a factors object",
    )
    p.add_argument("factors", metavar="FACTORS.json", help="a JSON file of factors, - for stdin")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 findings, 2 errors)."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    args.opened = []  # stores to close on the way out
    try:
        return func(args)
    except BrokenPipeError:  # e.g. `plancache ls | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except EXPECTED_ERRORS as exc:
        if args.debug:
            traceback.print_exc()
        message = str(exc) or type(exc).__name__
        print(f"plancache: error: {_scrub(message, args)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        for store in args.opened:
            with contextlib.suppress(*EXPECTED_ERRORS):
                store.close()
