"""``plancache cache pull`` and ``plancache cache push``: a generated-cache directory from and
to a store, for build steps and init containers (``plancache.caches``).

``--kind triton`` and ``--kind inductor`` are Triton's and Inductor's caches, scoped as
``plancache.caches.triton_cache`` and ``inductor_cache`` scope them (the installed versions,
the GPU: ``--gpu`` names another, else torch is imported to name it; Inductor's directory
is ``--dir`` or ``TORCHINDUCTOR_CACHE_DIR``, never torch's default, which torch would make);
any other kind is a directory given by ``--dir`` and
scoped by the ``--factor k=v`` pairs given (values are strings). The store is ``--url``
(default ``PLANCACHE_URL``), opened through the one open path without the local tier, with
every other ``PLANCACHE_*`` setting (keys, read-only mode, ``PLANCACHE_COMPILE_*``).

A pull installs every trusted bundle of the kind and scope, file by file, create-if-absent
(a file the directory holds with other bytes is kept and named on stderr), and records in
the directory (``.plancache-pulled-<kind>-<scope>.json``, a name no bundle holds) which
paths the stored bundles hold and which files were there before that no bundle holds; a
later push from that directory stores only the other files (``--all``: without that
record; never a file a trusted stored bundle holds), as one bundle named by its content
(``--dry-run``: only says what it would store). Both say the files and bytes they wrote
and skipped, with a progress bar on a terminal.

The first line (stderr) names the store and whether anything leaves this machine.

Exit status (``cli.main``): 0 done (a pull that found nothing is done: ``miss``, a first
boot; from a remote store without a key, an empty one is a ``miss`` too); 1 a pull refused
what it found (unsigned or badly signed bundles: each named on stderr); 2 an error,
one line: a store that failed or did not answer within the pull's bound, a push the store
did not take, a bad kind, factor or directory (a push's directory must exist).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson

from plancache._artifacts.engine import CompileSettings
from plancache._command.display import Progress, echo, plural, print_json, size
from plancache._config import Settings, is_remote, keyring_from_env
from plancache._directory import Directory
from plancache._redaction import without_userinfo
from plancache._signing import NO_KEYS
from plancache.caches import (
    CacheFetched,
    CachePushed,
    CacheShare,
    GeneratedCache,
    directory_cache,
    inductor_cache,
    triton_cache,
)
from plancache.errors import CliError

COMPUTED = {"triton": triton_cache, "inductor": inductor_cache}
"""The kinds whose scope is computed from what is installed here."""
RECORD_PREFIX = ".plancache-pulled-"
MAX_RECORD_BYTES = 64 << 20
_FACTOR_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
_HELP = (
    "pull a generated-cache directory (Triton's, Inductor's, any whose files are named by "
    "their own keys) from a store, or push what it holds to it"
)
UNSIGNED_HINT = (
    "plancache: from a remote store, only bundles signed by a key this node accepts are "
    "installed: set PLANCACHE_SIGNING_KEY where they are pushed and the same key here "
    "(PLANCACHE_VERIFY_KEYS), or --trust-unsigned"
)
"""Said after a pull from a remote store without a key that found nothing or refused."""
_PULL_HELP = (
    "install every trusted bundle of KIND in its scope into the directory, each file "
    "create-if-absent; exit 1 if any was refused"
)
_PUSH_HELP = (
    "store the directory's files that the last pull into it did not install as one bundle, "
    "create-if-absent"
)


def parse_factor(text: str) -> tuple[str, str]:
    """``k=v`` as a pair (argparse type): ``k`` a name of letters, digits, ``_.-``."""
    key, sep, value = text.partition("=")
    if not sep or not _FACTOR_KEY.fullmatch(key) or key == "cache":
        raise argparse.ArgumentTypeError(
            f"{text!r:.80} is not a factor k=v (k: letters, digits, _ . -; not 'cache')"
        )
    return key, value


def add_cache_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Add ``cache pull`` and ``cache push`` to the command's subparsers ``sub`` (``common``:
    the options every subcommand takes)."""
    parser = sub.add_parser("cache", parents=[common], help=_HELP, description=_HELP)
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb, func, doc in (
        ("pull", cmd_cache_pull, _PULL_HELP),
        ("push", cmd_cache_push, _PUSH_HELP),
    ):
        p = verbs.add_parser(verb, parents=[common], help=doc, description=doc)
        p.set_defaults(func=func)
        p.add_argument(
            "--kind",
            required=True,
            help="triton, inductor, or a kind of your own ([a-z][a-z0-9_]{0,31}) with --dir "
            "and --factor",
        )
        p.add_argument(
            "--dir",
            metavar="DIR",
            help="the cache directory (default: triton: $TRITON_CACHE_DIR or ~/.triton/cache; "
            "inductor: $TORCHINDUCTOR_CACHE_DIR; other kinds: required); a push needs it there",
        )
        p.add_argument(
            "--factor",
            action="append",
            type=parse_factor,
            default=[],
            metavar="K=V",
            help="what the files of a kind of your own depend on (versions, device, "
            "settings), one K=V each; the same on every node that shares them",
        )
        p.add_argument(
            "--gpu",
            metavar="NAME",
            help="triton and inductor: the GPU the cache is for, as plancache names it "
            "('NVIDIA H100 80GB HBM3 sm_90'; default: this machine's, 'none' without one)",
        )
        p.add_argument(
            "--url", metavar="URL", help="store URL or local path (default: $PLANCACHE_URL)"
        )
        p.add_argument("--json", action="store_true", help="machine-readable output")
    verbs.choices["pull"].add_argument(
        "--trust-unsigned",
        action="store_true",
        help="with no key configured, install unsigned bundles from a remote store too "
        "(their files are loaded as code: anyone who can write the bucket could run code)",
    )
    verbs.choices["push"].add_argument(
        "--dry-run",
        action="store_true",
        help="say what would be stored (files, bytes), store nothing",
    )
    verbs.choices["push"].add_argument(
        "--all",
        action="store_true",
        help="store every file of the directory that no stored bundle holds, not only those "
        "the last pull did not install",
    )


def _cache(args: argparse.Namespace, *, must_exist: bool) -> GeneratedCache:
    """The cache the arguments name (``must_exist``: its directory must be there: a push
    from a directory that is not is a mistake, not "nothing new"); ``CliError`` or
    ``ConfigError`` saying what is wrong."""
    if must_exist and args.dir is not None and not Path(args.dir).expanduser().is_dir():
        raise CliError(f"cache {args.verb}: {args.dir}: not a directory (nothing to push)")
    cache = _named(args)  # where --dir is not given, the kind's own directory
    if must_exist and not cache.root.is_dir():
        raise CliError(f"cache {args.verb}: {cache.root}: not a directory (nothing to push)")
    return cache


def _named(args: argparse.Namespace) -> GeneratedCache:
    factors = dict(args.factor)
    if len(factors) != len(args.factor):
        raise CliError("cache: a factor is given twice")
    if args.kind in COMPUTED:
        if factors:
            raise CliError(
                f"cache: the scope of kind {args.kind} is computed (versions, GPU): no "
                "--factor; --gpu names another GPU"
            )
        where = args.dir
        if args.kind == "inductor":  # torch's own default would import torch and make it
            where = where or os.environ.get("TORCHINDUCTOR_CACHE_DIR")
            if not where:
                raise CliError(
                    "cache: kind inductor needs --dir (or TORCHINDUCTOR_CACHE_DIR): the "
                    "directory the program's torch.compile uses"
                )
        return COMPUTED[args.kind](where, gpu=args.gpu)
    if args.gpu is not None:
        raise CliError("cache: --gpu is for kinds triton and inductor; give --factor gpu=NAME")
    if args.dir is None or not factors:
        raise CliError(
            f"cache: kind {args.kind!r:.40} needs --dir and the factors its files depend on "
            "(--factor version=1.2 ...)"
        )
    return directory_cache(args.kind, args.dir, factors)


def _share(args: argparse.Namespace) -> tuple[CacheShare, str]:
    """The store the arguments name, without the local tier, and its URL for display."""
    env = dict(os.environ)
    if args.url is not None:
        env["PLANCACHE_URL"] = args.url
    if args.storage_options is not None:
        env["PLANCACHE_STORAGE_OPTIONS"] = args.storage_options
    env["PLANCACHE_LOCAL_TIER"] = "0"
    env.setdefault("PLANCACHE_COMPILE_TIMEOUT", f"{args.timeout:g}")
    if getattr(args, "trust_unsigned", False):
        env["PLANCACHE_COMPILE_TRUST_UNSIGNED"] = "1"
    args.keyring = keyring_from_env(env)  # masked in any error line
    settings = Settings.from_env(env)
    share = CacheShare(settings, CompileSettings.from_env(env))
    args.opened.append(share)
    echo(f"plancache: store {settings.described()}", file=sys.stderr)  # the first line
    return share, settings.url


@contextlib.contextmanager
def _warnings() -> Iterator[list[str]]:
    """The warnings plancache logs meanwhile (why a bundle was refused or not written)."""
    caught: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            caught.append(record.getMessage())

    logger = logging.getLogger("plancache")
    handler = Catch(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield caught
    finally:
        logger.removeHandler(handler)


def _record(cache: GeneratedCache) -> str:
    return f"{RECORD_PREFIX}{cache.kind}-{cache.scope}.json"


def _recorded(cache: GeneratedCache) -> tuple[set[str], set[str]]:
    """What the last pulls into ``cache.root`` recorded: the paths the stored bundles hold,
    and those the directory held before that no bundle lists (``found``: not this program's
    compile's); none if there is no readable record of this user's (then a push stores
    every file). Read through the directory's guarded handle: a link, FIFO or device there
    is not followed or waited on, and a record another user could have written decides
    nothing."""
    path = cache.root / _record(cache)
    try:
        root = Directory.open(cache.root)
        if root is None:
            return set(), set()
        with root:
            read = root.read(_record(cache), MAX_RECORD_BYTES)
        if read is None:
            return set(), set()
        if read.foreign is not None:
            raise OSError(f"not this user's: {read.foreign}")
        record = orjson.loads(read.data)
        known, found = record["known"], record.get("found", [])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        echo(f"plancache: {path}: not read ({exc}): every file is pushed", file=sys.stderr)
        return set(), set()
    if not all(isinstance(x, list) and all(isinstance(p, str) for p in x) for x in (known, found)):
        echo(f"plancache: {path}: not a pull's record: every file is pushed", file=sys.stderr)
        return set(), set()
    return set(known), set(found)


def _remember(cache: GeneratedCache, fetched: CacheFetched) -> None:
    """Add what ``fetched`` found to the record of ``cache``'s pulls (this user's only,
    0600): a new temp file renamed over it, through the directory's guarded handle (never
    through a link). A path a bundle holds is no longer ``found``."""
    known, found = _recorded(cache)
    known |= fetched.known - fetched.found
    data = orjson.dumps(
        {
            "kind": cache.kind,
            "scope": cache.scope,
            "known": sorted(known),
            "found": sorted((found | fetched.found) - known),
        }
    )
    with Directory.make(cache.root) as root:
        root.write(_record(cache), data)


def _say(lines: list[str]) -> None:
    for line in lines:
        echo(line, file=sys.stderr)


def _progress(label: str) -> Callable[[int, int], None] | None:
    """The progress bar of a long pull or push, on a terminal only."""
    return Progress(sys.stderr, label).update if sys.stderr.isatty() else None


def _files(count: int, nbytes: int, what: str) -> str:
    """``3 files installed (1.5 KiB)``."""
    return f"{plural(count, 'file')} {what} ({size(nbytes)})"


def cmd_cache_pull(args: argparse.Namespace) -> int:
    cache = _cache(args, must_exist=False)
    share, url = _share(args)
    shown = without_userinfo(url)
    if not is_remote(url) and not Path(url.removeprefix("file://")).expanduser().is_dir():
        raise CliError(f"{shown}: no store there (the directory does not exist)")
    with _warnings() as warned:
        fetched = share.pull(cache, progress=_progress("pulling bundles"))
    _say(warned)
    if fetched.reason in ("store-error", "timeout"):
        raise CliError(f"cache pull: {shown}: {fetched.reason} (nothing more installed)")
    if fetched.known:
        _remember(cache, fetched)
    if args.json:
        print_json(
            {
                **_which(cache, shown),
                "reason": fetched.reason,
                "bundles": fetched.bundles,
                "installed": fetched.installed,
                "installed_bytes": fetched.installed_bytes,
                "skipped": fetched.skipped,
                "skipped_bytes": fetched.skipped_bytes,
                "differing": list(fetched.differing),
                "found": len(fetched.found),
                "known": len(fetched.known),
                "seconds": round(fetched.seconds, 3),
            }
        )
    else:
        echo(pulled_text(cache, fetched, shown))
        if fetched.found:
            echo(
                f"{cache.kind} cache {cache.root}: {plural(len(fetched.found), 'file')} there "
                "before the pull that no bundle holds: not this program's, so 'cache push' "
                "leaves them out (--all stores them)"
            )
    unkeyed = args.keyring is NO_KEYS and not args.trust_unsigned
    if fetched.reason in ("untrusted", "miss") and is_remote(url) and unkeyed:
        _say([UNSIGNED_HINT])
    return 1 if fetched.reason in ("untrusted", "invalid") else 0


def _which(cache: GeneratedCache, url: str) -> dict[str, str]:
    """What a pull's or a push's JSON names first: the cache and the store."""
    return {"kind": cache.kind, "scope": cache.scope, "dir": str(cache.root), "url": url}


def cmd_cache_push(args: argparse.Namespace) -> int:
    cache = _cache(args, must_exist=True)
    share, url = _share(args)
    shown = without_userinfo(url)
    known, found = (set(), set()) if args.all else _recorded(cache)
    with _warnings() as warned:
        pushed = share.push(
            cache, known | found, dry_run=args.dry_run, progress=_progress("pushing files")
        )
    _say(warned)
    if pushed.files and not args.dry_run and not pushed.stored:
        raise CliError(f"cache push: {shown}: the bundle was not written to the store")
    if args.json:
        print_json(
            {
                **_which(cache, shown),
                "files": pushed.files,
                "bytes": pushed.bytes,
                "skipped": pushed.skipped,
                "skipped_bytes": pushed.skipped_bytes,
                "dry_run": pushed.dry_run,
                "written": pushed.written,
            }
        )
    else:
        echo(pushed_text(cache, pushed, shown, found=bool(found)))
    return 0


def pulled_text(cache: GeneratedCache, fetched: CacheFetched, shown: str) -> str:
    """A pull's line: the cache, the reason, what it installed and found there, from where,
    how long."""
    return (
        f"{cache.kind} cache {cache.root}: {fetched.reason}, "
        f"{plural(fetched.bundles, 'bundle')}, "
        f"{_files(fetched.installed, fetched.installed_bytes, 'installed')}, "
        f"{_files(fetched.skipped, fetched.skipped_bytes, 'there already')}, "
        f"from {shown} ({fetched.seconds:.3f} s)"
    )


def pushed_text(
    cache: GeneratedCache, pushed: CachePushed, shown: str, *, found: bool = False
) -> str:
    """A push's line: the cache, what it stored (or would, on a dry run) where, and what it
    skipped (``found``: the last pull's record left files out)."""
    skipped = _files(pushed.skipped, pushed.skipped_bytes, "skipped")
    skipped += " (stored already, or there before the last pull: --all)" if found else ""
    head = f"{cache.kind} cache {cache.root}:"
    if not pushed.files:
        return f"{head} nothing new: nothing stored in {shown}; {skipped}"
    if pushed.dry_run:
        return (
            f"{head} {_files(pushed.files, pushed.bytes, 'would be stored')} as one bundle in "
            f"{shown} (dry run: nothing written); {skipped}"
        )
    done = "stored" if pushed.written.get("store") else "stored already"
    return (
        f"{head} {plural(pushed.files, 'file')} {done} as one bundle ({size(pushed.bytes)}) "
        f"in {shown}; {skipped}"
    )
