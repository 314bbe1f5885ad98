"""The subcommands of the ``plancache`` command, one ``cmd_*`` function each.

Every subcommand opens the store it names (or ``PLANCACHE_URL``) directly, without the local
tier, so what it shows is what that store itself holds (a remote store opens on first use,
waiting at most ``LazyStore.open_timeout`` for its client), with the keys of the environment
(``PLANCACHE_SIGNING_KEY``, ...): writes (``cp``, ``prune``) are signed with the signing key,
and records the keys reject are shown as such, never copied or pruned. The work is done by
``plancache._inventory.plans``; this module prints (through ``display.echo``: control characters
escaped). No key is ever printed; key ids are.

A ``cmd_*`` function takes the parsed arguments (``plancache._command.cli.build_parser``) with two
more attributes that ``plancache._command.cli`` sets: ``opened``, a list to which every store it
opens is appended (the caller closes them), and ``keyring``, None until the command reads
its keys. It returns the exit status (0 ok, 1 findings) and raises on any failure.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson

from plancache._artifacts.archive import compile_cache
from plancache._artifacts.share import CompileSettings
from plancache._backends.local import LocalStore
from plancache._command import artifacts as artifact_commands
from plancache._command.display import (
    Progress,
    age,
    echo,
    plural,
    print_json,
    print_table,
    printable,
    size,
    when,
)
from plancache._config import (
    Settings,
    is_remote,
    keyring_from_env,
    parse_storage_options,
    read_key_file,
)
from plancache._defaults import default_dir
from plancache._inventory import artifacts as inventory_artifacts
from plancache._inventory import plans as inventory
from plancache._inventory.plans import device
from plancache._keys import canonical, fingerprint
from plancache._plan import Plan
from plancache._signing import Keyring, parse_keys
from plancache._store import PlanStore, beneath
from plancache._units import gib
from plancache.errors import CliError as CliError  # the command's own errors
from plancache.errors import InvalidPlanError


# -- shared helpers ----------------------------------------------------------------------------
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
    else, for a remote store, those of the environment; appended to ``args.opened``, which the
    caller closes. A remote store opens on first use (``LazyStore``), and an object store
    is written only once the conformance probe found it honest (``open_guarded``: a write to
    one that ignores preconditions raises, unless ``PLANCACHE_TRUST_PRECONDITIONS=1``). A
    local store that must exist but does not is an error."""
    url, storage_options = _where(args, url, options, flag, shared_for_local)
    env = Settings.from_env()
    settings = dataclasses.replace(
        env,
        url=url,
        storage_options=storage_options,
        local_tier=None,
        keyring=_keyring(args),
        write_patience=0.0,  # a command says at once that it could not write
    )
    store = settings.open_store()
    args.opened.append(store)
    local = None if is_remote(url) else next(s for s in beneath(store))
    if must_exist and isinstance(local, LocalStore) and not local.root.exists():
        raise CliError(f"{store.url}: no store there (the directory does not exist)")
    return store


def _where(
    args: argparse.Namespace, url: str | None, options: str | None, flag: str, shared: bool
) -> tuple[str, dict[str, Any]]:
    """The URL and storage options ``_open`` opens (see there)."""
    settings = Settings.from_env() if url is None else None
    url = settings.url if settings is not None else url
    assert url is not None
    if options is None and (shared or is_remote(url)):
        options, flag = args.storage_options, "--storage-options"
    storage_options: dict[str, Any] = {}
    if options is not None:
        storage_options = parse_storage_options(options, flag)
    elif is_remote(url):
        storage_options = dict((settings or Settings.from_env()).storage_options)
    return url, storage_options


def _max_bytes() -> int:
    """This process's cap on a compile artifact's size (``PLANCACHE_COMPILE_MAX_BYTES``)."""
    return CompileSettings.from_env().max_bytes


def _keyring(args: argparse.Namespace) -> Keyring:
    """The keys of the command: those of ``--keys-file`` (verify keys), else of the
    environment; read once."""
    if args.keyring is None:
        name = getattr(args, "keys_file", None)
        if name is None:
            args.keyring = keyring_from_env()
        else:
            text = read_key_file(name, "--keys-file")
            args.keyring = Keyring(verify_keys=parse_keys(text, "--keys-file", comments=True))
    keyring: Keyring = args.keyring
    return keyring


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


# -- subcommands -------------------------------------------------------------------------------
SORT_KEYS: dict[str, Callable[[Plan], Any]] = {
    "age": lambda p: -p.created_at,
    "kv": lambda p: -p.max_kv_cache_memory_bytes,
    "baseline": lambda p: -p.min_free_memory_baseline,
    "device": device,
    "fp": lambda p: p.fingerprint,
}


def cmd_ls(args: argparse.Namespace) -> int:
    """One row per plan; invalid records listed after them, with the reason."""
    store = _open(args, args.url)
    entries = inventory.scan(store)
    sort_key = SORT_KEYS[args.sort]
    valid = sorted(
        ((e.plan, e) for e in entries if e.plan is not None), key=lambda pe: sort_key(pe[0])
    )
    invalid = [e for e in entries if e.plan is None]
    now = time.time()
    if args.json:
        print_json(
            [inventory.entry_dict(e, now) for e in [e for _, e in valid] + invalid]
            + [
                artifact_commands.entry_dict(a)
                for a in inventory_artifacts.scan(store, _max_bytes())
            ]
            + [
                artifact_commands.bundle_dict(b)
                for b in inventory_artifacts.scan(store, _max_bytes(), inventory_artifacts.CACHES)
            ]
            + [
                artifact_commands.info_dict(m)
                for m in inventory_artifacts.scan(store, kind=inventory_artifacts.MODEL_INFO)
            ]
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
    artifacts = artifact_commands.ls(store, keyring, _max_bytes())
    bundles = artifact_commands.ls_bundles(store, keyring, _max_bytes())
    infos = artifact_commands.ls_model_info(store, keyring)
    rejected = sum(e.rejected is not None for _, e in valid)
    summary = f"{plural(len(valid), 'plan')}, {len(invalid)} invalid"
    if artifacts:
        summary += f", {plural(len(artifacts), 'compile artifact')}"
    if bundles:
        summary += f", {plural(len(bundles), 'cache bundle')}"
    if infos:
        summary += f", {plural(len(infos), 'model info')}"
    if rejected:
        summary += f", {rejected} not validly signed (never applied with these keys)"
    echo(f"{summary}, in {store.url}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """The whole record under a fingerprint or a unique prefix of one."""
    store = _open(args, args.url)
    if artifact_commands.is_ref(args.fingerprint):
        return artifact_commands.show(store, args.fingerprint, store.keyring, _max_bytes())
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
    rows = [
        [
            gib(o.free_memory_baseline),
            gib(o.kv_cache_memory_bytes),
            when(o.created_at, now),
            " ".join(f"{k}={v}" for k, v in sorted(o.producer.items())) or "-",
        ]
        for o in p.observations
    ]
    print_table(["  BASELINE GiB", "KV GiB", "CREATED", "PRODUCER"], rows, right={0, 1})
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


def cmd_verify(args: argparse.Namespace) -> int:
    """Check every record (with ``--require-signature`` its signature too, against the keys
    of ``--keys-file`` or the environment); exit 1 if findings remain (``--fix`` deletes
    them)."""
    if args.keys_file is not None and not args.require_signature:
        raise CliError("--keys-file goes with --require-signature")
    store = _open(args, args.url)
    keys = store.keyring
    if args.require_signature and not keys.requires_signature:
        raise CliError(
            "--require-signature needs keys: set PLANCACHE_SIGNING_KEY[_FILE] or "
            "PLANCACHE_VERIFY_KEYS[_FILE], or give --keys-file"
        )
    result = inventory.verify(store, fix=args.fix, require_signature=args.require_signature)
    for e in result.other_schema:
        echo(f"{e.fingerprint}  {e.error} (another version's record: kept)")
    for f in result.findings:
        note = "" if f.fix is None else f"  ({f.fix})"
        note += f": {f.detail}" if f.detail else ""
        echo(f"{f.entry.fingerprint}  {f.entry.problem}{note}")
    bad = len(result.findings)
    unsigned = sum(f.entry.rejected is not None for f in result.findings)
    summary = f"{plural(result.checked, 'record')} checked in {store.url}: {bad - unsigned} invalid"
    if args.require_signature:
        summary += f", {unsigned} not validly signed (keys {', '.join(keys.key_ids)})"
    echo(summary + (f", {result.deleted} deleted" if args.fix else ""))
    broken, broken_kept = artifact_commands.verify(
        store, keys, _max_bytes(), fix=args.fix, require_signature=args.require_signature
    )
    refused = sum(f.fix is inventory.Fix.REFUSED for f in result.findings) + broken_kept
    return 1 if (bad or broken) and (not args.fix or refused) else 0


def cmd_rm(args: argparse.Namespace) -> int:
    """Delete plans by fingerprint or unique prefix; every prefix is resolved first."""
    store = _open(args, args.url)
    refs = [f for f in args.fingerprints if artifact_commands.is_ref(f)]
    if refs:
        artifact_commands.rm(store, refs)
    plans = [f for f in args.fingerprints if f not in refs]
    for fp, deleted in inventory.remove(store, plans) if plans else ():
        echo(f"deleted {fp}" if deleted else f"already gone {fp}")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    """Drop observations recorded longer ago than ``--older-than`` (deleting plans left with
    none), and abandoned temp files."""
    store = _open(args, args.url)
    now = time.time()
    result = inventory.prune(store, args.older_than, dry_run=args.dry_run, now=now)
    verb = "would drop" if args.dry_run else "dropped"
    for p in result.plans:
        old = sum(inventory.prunable(o.created_at, args.older_than, now) for o in p.observations)
        echo(f"{verb} {old} of {plural(len(p.observations), 'observation')} {p.fingerprint}")
    limit = age(args.older_than)
    summary = (
        f"{verb} {plural(result.observations, 'observation')} older than {limit}"
        + (f" ({result.ahead} dated over {limit} ahead)" if result.ahead else "")
        + f" in {store.url}, "
        f"{'would delete' if args.dry_run else 'deleted'} {plural(result.deleted, 'plan')}"
    )
    if result.temp_files is not None:
        summary += f", and {plural(result.temp_files, 'abandoned temp file')}"
    if result.marks:
        summary += f", and {plural(result.marks, 'crash mark')}"
    if result.invalid:
        left = plural(result.invalid, "invalid record")
        summary += f"; {left} left (`plancache verify --fix` deletes them)"
    if result.rejected:
        left = plural(result.rejected, "record")
        summary += f"; {left} not validly signed left as they are"
    echo(summary)
    installs = compile_cache(default_dir().parent) if result.temp_files is not None else None
    artifact_commands.prune(
        store, args.older_than, _max_bytes(), dry_run=args.dry_run, installs=installs
    )
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
    progress = Progress(sys.stderr, "copying").update if sys.stderr.isatty() else None
    c = inventory.copy(src, dst, progress=progress)
    echo(
        f"copied {src.url} -> {dst.url}: {c.created} created, {c.replaced} replaced, "
        f"{c.kept} kept, {c.invalid} invalid skipped"
        + (f", {c.rejected} not validly signed skipped" if c.rejected else "")
        + (f", {c.vanished} deleted meanwhile" if c.vanished else "")
    )
    # a node installs unsigned artifacts without a key from a local store only: copying
    # into one must not make unsigned code trusted
    trusting = args.trust_unsigned or is_remote(args.dst)
    artifact_commands.cp(src, dst, src.keyring, trust_unsigned=trusting)
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """Counts, bytes, oldest and newest plan, devices seen."""
    store = _open(args, args.url)
    s = inventory.stats(store)
    a = artifact_commands.stats(store, _max_bytes())
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
    if a["artifacts"]:
        echo(f"compile  {plural(a['artifacts'], 'artifact')}, {size(a['artifact_bytes'])}")
    if a["cache_bundles"]:
        echo(f"caches   {plural(a['cache_bundles'], 'bundle')}, {size(a['cache_bundle_bytes'])}")
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
    echo(fingerprint(obj))
    echo(encoding.decode())
    return 0
