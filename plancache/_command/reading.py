"""The subcommands that show what a store holds and change nothing: ``ls``, ``show`` and
``stats``.

Each opens its store through ``plancache._command.stores`` (see there for the keys it uses
and what a ``cmd_*`` function takes and returns); the plans kind's inventory
(``plancache._inventory.plans``) and the other kinds' (``plancache._command.artifacts``) do
the reading; this module prints (through ``display.echo``: control characters escaped).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from plancache._command import artifacts as artifact_commands
from plancache._command.display import (
    age,
    echo,
    plural,
    print_json,
    print_table,
    printable,
    size,
    when,
)
from plancache._command.stores import max_artifact_bytes, open_named
from plancache._inventory import plans as inventory
from plancache._inventory.plans import device
from plancache._plan import Plan
from plancache._signing import Keyring
from plancache._units import gib
from plancache.errors import CliError

SORT_KEYS: dict[str, Callable[[Plan], Any]] = {
    "age": lambda p: -p.created_at,
    "kv": lambda p: -p.max_kv_cache_memory_bytes,
    "baseline": lambda p: -p.min_free_memory_baseline,
    "device": device,
    "fp": lambda p: p.fingerprint,
}
"""``ls --sort``: the order of each choice."""


def _signed(entry: inventory.PlanRecord, keyring: Keyring) -> str:
    """The key id that signed ``entry``'s plan (``-``: none), and where the keys reject the
    signature, why in a word."""
    assert entry.plan is not None
    sig = entry.plan.signature
    text = "-" if sig is None else sig.keyid
    if entry.rejected is not None:
        text += f" ({keyring.verdict(entry.plan)})"
    return text


def _host(producer: Mapping[str, Any]) -> str:
    return str(producer.get("host", "-"))


def cmd_ls(args: argparse.Namespace) -> int:
    """One row per plan; invalid records listed after them, with the reason; then the other
    kinds."""
    store = open_named(args, args.url)
    entries = inventory.scan(store)
    sort_key = SORT_KEYS[args.sort]
    valid = sorted(
        ((e.plan, e) for e in entries if e.plan is not None), key=lambda pe: sort_key(pe[0])
    )
    invalid = [e for e in entries if e.plan is None and not e.unreadable]
    now = time.time()
    if args.json:
        print_json(
            [inventory.entry_dict(e, now) for e in [e for _, e in valid] + invalid]
            + artifact_commands.dicts(store.layer, max_artifact_bytes())
        )
        return 0
    keyring = store.keyring
    # the SIGNED column shows where keys are configured or a record is signed
    signed = keyring.requires_signature or any(p.signature is not None for p, _ in valid)
    rows = [
        [
            p.fingerprint[:12],
            inventory.model(p),
            device(p),
            str(len(p.observations)),
            gib(p.max_kv_cache_memory_bytes),
            gib(p.min_free_memory_baseline),
            age(now - p.created_at),
            _host({} if p.newest is None else p.newest.producer),
            *([_signed(e, keyring)] if signed else []),
        ]
        for p, e in valid
    ]
    if rows:
        headers = ["FINGERPRINT", "MODEL", "DEVICE", "OBS", "MAX KV GiB", "MIN BASELINE GiB"]
        headers += ["AGE", "HOST", *(["SIGNED"] if signed else [])]
        print_table(headers, rows, right={3, 4, 5, 6})
    if invalid:
        echo("invalid records (never applied; `plancache verify --fix` deletes them):")
        for e in invalid:
            echo(f"  {e.fingerprint[:12]}  {e.error}")
    for e in entries:
        if e.unreadable:
            echo(f"  unreadable plan {e.fingerprint[:12]}: {e.error}")
    listed = artifact_commands.ls(store.layer, keyring, max_artifact_bytes())
    artifact_commands.ls_claims(store.layer, max_artifact_bytes())
    rejected = sum(e.rejected is not None for _, e in valid)
    parts = [f"{plural(len(valid), 'plan')}, {len(invalid)} invalid"] if valid or invalid else []
    if unreadable := sum(e.unreadable for e in entries):
        parts.append(f"{unreadable} unreadable")
    parts += [plural(len(found), kind.label) for kind, found in listed if found]
    if rejected:
        parts.append(f"{rejected} not validly signed (never applied with these keys)")
    summary = ", ".join(parts) or "nothing stored"
    echo(f"{summary}, in {store.url}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """The whole record under a fingerprint or a unique prefix of one (another kind's under
    its reference); exit 1 for an invalid record (its bytes shown)."""
    store = open_named(args, args.url)
    if artifact_commands.is_ref(args.fingerprint):
        return artifact_commands.show(
            store.layer, args.fingerprint, store.keyring, max_artifact_bytes()
        )
    [fp] = inventory.resolve(store, [args.fingerprint])
    entry = inventory.read_entry(store, fp)
    if entry is None:
        raise CliError(f"plan {fp} was deleted meanwhile")
    if entry.plan is None:
        for line in entry.raw.decode("utf-8", "replace").splitlines():
            echo(line)
        echo(f"plancache: invalid record {fp}: {entry.error}", file=sys.stderr)
        return 1
    p = entry.plan
    if args.json:
        print_json(p.to_dict())
        return 0
    now = time.time()
    factors = {printable(k): v for k, v in p.factors.items()}
    width = max(map(len, factors), default=0)
    echo(f"fingerprint  {p.fingerprint}")
    echo(f"model        {inventory.model(p)}")
    echo(f"store        {store.url}")
    echo(f"observations {len(p.observations)} (a node applies the largest KV whose baseline fits)")
    if p.signature is not None or store.keyring.requires_signature:
        judged = f" ({entry.problem or 'valid'})" if store.keyring.requires_signature else ""
        echo(f"signed       {'no' if p.signature is None else p.signature.keyid}{judged}")
    if p.provisional:
        echo(
            f"provisional  {len(p.provisional)} (measured by boots that compiled during "
            "profiling: only boots that compile apply them)"
        )
    rows = [
        [
            gib(o.free_memory_baseline),
            gib(o.kv_cache_memory_bytes),
            when(o.created_at, now),
            " ".join(f"{k}={v}" for k, v in sorted(o.producer.items())) or "-",
            *(["yes" if o in p.provisional else "no"] if p.provisional else []),
        ]
        for o in sorted((*p.observations, *p.provisional), key=lambda o: o.free_memory_baseline)
    ]
    headers = ["  BASELINE GiB", "KV GiB", "CREATED", "PRODUCER"]
    print_table([*headers, *(["PROVISIONAL"] if p.provisional else [])], rows, right={0, 1})
    if p.labels:
        echo("labels")
        labels = {printable(k): v for k, v in p.labels.items()}
        label_width = max(map(len, labels))
        for key in sorted(labels):
            echo(f"  {key.ljust(label_width)}  {orjson.dumps(labels[key]).decode()}")
    echo("factors")
    for key in sorted(factors):
        echo(f"  {key.ljust(width)}  {orjson.dumps(factors[key]).decode()}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """Counts, bytes, oldest and newest plan, devices seen; compile artifacts and cache
    bundles with their bytes; per kind, what the reported boots decided and rebuilt anyway
    (``--json`` adds the artifacts' oldest and newest and the model infos: every field is
    listed in docs/cli.md)."""
    store = open_named(args, args.url)
    s = inventory.stats(store)
    a = artifact_commands.stats(store.layer, max_artifact_bytes(), store.keyring)
    if args.json:
        print_json({**dataclasses.asdict(s), **a})
        return 0
    now = time.time()
    echo(f"store    {s.url}")
    echo(f"plans    {s.plans} ({s.invalid} invalid)")
    echo(f"bytes    {size(s.bytes)}")
    echo(f"oldest   {'-' if s.oldest is None else when(s.oldest, now)}")
    echo(f"newest   {'-' if s.newest is None else when(s.newest, now)}")
    echo(f"devices  {', '.join(f'{d} ({n})' for d, n in s.devices.items()) or '-'}")
    for line in artifact_commands.stats_text(a):
        echo(line)
    return 0
