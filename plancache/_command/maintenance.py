"""The subcommands that check, delete and copy what a store holds: ``verify``, ``rm``,
``prune`` and ``cp``.

Each opens its stores through ``plancache._command.stores`` (see there for the keys it uses,
and what a ``cmd_*`` function takes and returns): what they write is signed with the signing
key, and records the keys reject are reported, never copied or pruned. The plans kind's
inventory (``plancache._inventory.plans``) and the other kinds' (``plancache._command.artifacts``)
do the work; this module prints (through ``display.echo``: control characters escaped).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from plancache._artifacts.archive import compile_cache
from plancache._command import artifacts as artifact_commands
from plancache._command.display import Progress, age, echo, plural
from plancache._command.stores import max_artifact_bytes, open_named
from plancache._config import is_remote
from plancache._defaults import default_dir
from plancache._inventory import plans as inventory
from plancache.errors import CliError


def cmd_verify(args: argparse.Namespace) -> int:
    """Check every record (with ``--require-signature`` its signature too, against the keys
    of ``--keys-file`` or the environment); exit 1 if findings remain (``--fix`` deletes
    them)."""
    if args.keys_file is not None and not args.require_signature:
        raise CliError("--keys-file goes with --require-signature")
    store = open_named(args, args.url)
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
        store.layer,
        keys,
        max_artifact_bytes(),
        fix=args.fix,
        require_signature=args.require_signature,
    )
    refused = sum(f.fix is inventory.Fix.REFUSED for f in result.findings) + broken_kept
    return 1 if (bad or broken) and (not args.fix or refused) else 0


def cmd_rm(args: argparse.Namespace) -> int:
    """Delete what the references name: plans by fingerprint or unique prefix, other kinds
    by their object names or short references (a compile artifact's ``KEY/rank_R_D``, every
    bundle of a cache's scope: ``cache_<kind>_<scope>``); every reference is resolved
    first."""
    store = open_named(args, args.url)
    refs = [f for f in args.refs if artifact_commands.is_ref(f)]
    if refs:
        artifact_commands.rm(store.layer, refs)
    plans = [f for f in args.refs if f not in refs]
    for fp, deleted in inventory.remove(store, plans) if plans else ():
        echo(f"deleted {fp}" if deleted else f"already gone {fp}")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    """Drop observations recorded longer ago than ``--older-than`` (deleting plans left with
    none), and abandoned temp files; then the other kinds older than that, and with
    ``--keep-newest N`` the cache bundles past the newest N of their kind and scope."""
    if args.older_than is None and args.keep_newest is None:
        raise CliError("prune: give --older-than AGE, --keep-newest N, or both")
    if args.keep_newest is not None and args.keep_newest < 0:
        raise CliError("prune: --keep-newest takes a count (0 or more)")
    store = open_named(args, args.url)
    if args.older_than is None:
        artifact_commands.prune(
            store.layer, None, max_artifact_bytes(), dry_run=args.dry_run, keep=args.keep_newest
        )
        return 0
    now = time.time()
    result = inventory.prune(store, args.older_than, dry_run=args.dry_run, now=now)
    verb = "would drop" if args.dry_run else "dropped"
    for p in result.plans:
        points = (*p.observations, *p.provisional)
        old = sum(inventory.prunable(o.created_at, args.older_than, now) for o in points)
        echo(f"{verb} {old} of {plural(len(points), 'observation')} {p.fingerprint}")
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
    triton = Path(os.environ.get("TRITON_CACHE_DIR") or "~/.triton/cache").expanduser()
    artifact_commands.prune(
        store.layer,
        args.older_than,
        max_artifact_bytes(),
        dry_run=args.dry_run,
        installs=installs,
        roots=[triton],
        keep=args.keep_newest,
    )
    return 0


def cmd_cp(args: argparse.Namespace) -> int:
    """Copy every valid plan from SRC into DST with merge semantics (``DST.put``), then the
    other kinds under their trust rule."""
    # --storage-options serves whichever side is remote; the other may be a local path
    src = open_named(
        args, args.src, args.src_opts, flag="--src-storage-options", shared_for_local=False
    )
    dst = open_named(
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
    artifact_commands.cp(
        src.layer, dst.layer, src.keyring, max_artifact_bytes(), trust_unsigned=trusting
    )
    return 0
