"""The ``plancache`` command: see what a store holds, check it, copy it and prune it.

This module parses the arguments, runs the subcommand they name (``reading``: ``ls``, ``show``,
``stats``; ``maintenance``: ``verify``, ``rm``, ``prune``, ``cp``; ``fingerprint``;
``explain``; ``doctor``;
``caches``: ``cache pull``, ``cache push``; ``run``) and turns every failure into one line,
``plancache: error: ...``, and exit status 2; ``--debug`` adds the traceback (secrets and
keys masked).

A whole command is bounded by ``--timeout`` (default ``MAX_SECONDS``): past it, one
error line and exit 2, whatever a call is stuck in; the executable then exits at once,
without waiting for the threads such a call left behind. ``run`` is the exception: it runs
in the main thread (it handles signals), for as long as its program runs, and its own parts
are bounded by their settings (``plancache._command.run``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

from plancache import _background as background
from plancache._command.caches import add_cache_command
from plancache._command.display import echo
from plancache._command.doctor import cmd_doctor
from plancache._command.explain import NEAREST, cmd_explain
from plancache._command.fingerprint import cmd_fingerprint
from plancache._command.maintenance import cmd_cp, cmd_prune, cmd_rm, cmd_verify
from plancache._command.reading import SORT_KEYS, cmd_ls, cmd_show, cmd_stats
from plancache._command.run import add_run_command
from plancache._defaults import MAX_SECONDS, STORAGE_OPTIONS, parse_seconds, parse_storage_options
from plancache._redaction import scrub, secret_values, without_userinfo
from plancache._version import __version__
from plancache.errors import CliError, ConfigError, PlanStoreError

EXPECTED_ERRORS = (PlanStoreError, ValueError, OSError)
"""Failures whose message alone is the error line (ConfigError and InvalidPlanError are
ValueErrors); the line of any other names the exception's type too. Every failure exits 2."""


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_OPTION_ARGS = ("storage_options", "src_opts", "dst_opts")
_DEBUG_HELP = "show the traceback of an error"
_TIMEOUT_HELP = (
    f"most time the whole command may take: seconds, or 90s, 10m (at most {MAX_SECONDS:g}; "
    f"default: {MAX_SECONDS:g})"
)
_OPTIONS_HELP = "storage options as a JSON object (default: $PLANCACHE_STORAGE_OPTIONS)"
_URL_HELP = "store URL or local path (default: $PLANCACHE_URL)"
_URL_OPERAND_HELP = "the same as --url (give one of the two)"
_EPILOG = (
    "Every command on one store takes it as --url URL; ls, verify, prune, stats and doctor "
    "also take it as their operand URL (the same thing). URL defaults to $PLANCACHE_URL "
    "(else the local default directory). cp takes two stores, SRC and DST."
)
_COMMAND_HELP = {
    "ls": "list what a store holds, one row each: plans (invalid records too, with the "
    "reason), compile artifacts, cache bundles (object, kind, scope, size), model infos",
    "show": "show a whole record, factors included, by fingerprint or unique prefix (a "
    "compile artifact's manifest: KEY/rank_R_D; a bundle's: its object name)",
    "verify": "check every record against the format's rules (and, with --require-signature, "
    "its signature); exit 1 if any fails",
    "rm": "delete what a store holds by reference: plans by fingerprint or unique prefix, "
    "objects by name (compile artifacts: KEY/rank_R_D; every bundle of a cache's scope: "
    "cache_<kind>_<scope>)",
    "prune": "delete what is older than an age (plans: observations older, or dated more "
    "than that ahead; a plan left with none is deleted), abandoned temp files of local "
    "stores, and with --keep-newest N the cache bundles past the newest N of their scope",
    "cp": "copy every valid plan from SRC to DST, merging with what DST holds, then the "
    "other kinds (artifacts and bundles create-if-absent, under the trust rule)",
    "stats": "plan count, bytes, oldest and newest plan, devices seen, compile artifacts, what "
    "the reported boots decided and rebuilt anyway",
    "fingerprint": "print the fingerprint and canonical encoding of a factors object",
    "explain": "why a node's factors found no plan: the stored plans nearest to them, each "
    "with the factors that differ (stored value and the node's)",
    "doctor": "check a store (reachability, credentials, permissions, whether it honours "
    "conditional writes, clock skew) and this node (signing, local directories, vLLM); "
    "exit 1 if anything is found",
}
_SORT_HELP = (
    "age: newest first; kv: largest max KV first; baseline: largest min baseline first; "
    "device, fp: A-Z (default: age)"
)


# -- argument types and masking ----------------------------------------------------------------
def parse_duration(text: str) -> float:
    """``30d``, ``12h``, ``45m`` or ``10s`` as seconds (argparse type)."""
    match = _DURATION.fullmatch(text.strip().lower())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30d, 12h, 45m or 10s")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _positive(text: str) -> int:
    """A count of 1 or more, for ``argparse``."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of 1 or more")
    return value


def parse_timeout_argument(text: str) -> float:
    """The ``--timeout`` argument: ``90``, ``90s`` or ``10m`` as seconds in the range of every
    time setting (``plancache._defaults.parse_seconds``: at most ``MAX_SECONDS``); argparse type,
    so that anything else (``nan``, ``inf``, ``0``, ``1e10``) is a usage error. Unlike
    ``plancache._defaults.parse_timeout`` (a variable's value: seconds only, ``ConfigError``),
    it takes a unit."""
    number = text
    with contextlib.suppress(argparse.ArgumentTypeError):
        number = str(parse_duration(text))
    try:
        return parse_seconds(number)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def _scrub(message: str, args: argparse.Namespace) -> str:
    """``message`` with every secret of the command's storage options, and every key it
    read, masked."""
    texts = [os.environ.get(STORAGE_OPTIONS.name)]
    texts += [getattr(args, name, None) for name in _OPTION_ARGS]
    secrets: list[str] = []
    for text in filter(None, texts):
        with contextlib.suppress(ConfigError):
            secrets += secret_values(parse_storage_options(text, "storage options"))
    message = scrub(message, secrets)
    return message if args.keyring is None else args.keyring.scrub(message)


# -- parser and entry point --------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The ``plancache`` argument parser, one subparser per subcommand."""
    parser = argparse.ArgumentParser(
        prog="plancache",
        description="Inspect and manage plancache stores (local, s3://, gs://): vLLM startup "
        "plans, compile artifacts, cache bundles of any program (Inductor's, Triton's, your "
        "own), model infos; pull and push a cache directory (cache pull, cache push).",
        epilog=_EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"plancache {__version__}")
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    parser.add_argument("--storage-options", metavar="JSON", help=_OPTIONS_HELP)
    parser.add_argument(
        "--timeout",
        type=parse_timeout_argument,
        default=MAX_SECONDS,
        metavar="T",
        help=_TIMEOUT_HELP,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP)
    common.add_argument(
        "--timeout",
        type=parse_timeout_argument,
        default=argparse.SUPPRESS,
        metavar="T",
        help=_TIMEOUT_HELP,
    )
    common.add_argument(
        "--storage-options", metavar="JSON", default=argparse.SUPPRESS, help=_OPTIONS_HELP
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, func: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
        doc = _COMMAND_HELP[name]
        p = sub.add_parser(name, parents=[common], help=doc, description=doc)
        p.set_defaults(func=func)
        return p

    def url(p: argparse.ArgumentParser, *, positional: bool = True) -> None:
        """The store of a command on one store: ``--url URL``, and where the store is the
        only operand, ``URL`` too (``_one_store`` merges the two into ``args.url``)."""
        p.add_argument("--url", metavar="URL", help=_URL_HELP)
        if positional:
            p.add_argument("url_operand", nargs="?", metavar="URL", help=_URL_OPERAND_HELP)

    url(p := command("ls", cmd_ls))
    p.add_argument("--sort", choices=sorted(SORT_KEYS), default="age", help=_SORT_HELP)
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = command("show", cmd_show)
    p.add_argument("fingerprint", metavar="FP", help="a fingerprint or a unique prefix")
    url(p, positional=False)
    p.add_argument("--json", action="store_true", help="the record as stored (JSON)")

    url(p := command("verify", cmd_verify))
    p.add_argument("--fix", action="store_true", help="delete the records found")
    p.add_argument(
        "--require-signature",
        action="store_true",
        help="also report records without a valid signature from an accepted key (keys: "
        "--keys-file, else $PLANCACHE_SIGNING_KEY[_FILE] and $PLANCACHE_VERIFY_KEYS[_FILE])",
    )
    p.add_argument(
        "--keys-file",
        metavar="FILE",
        help="accepted keys, one per line, instead of those of the environment",
    )

    p = command("rm", cmd_rm)
    p.add_argument(
        "refs",
        nargs="+",
        metavar="REF",
        help="a plan's fingerprint or unique prefix, an object's name (ls shows them), a "
        "compile artifact's KEY/rank_R_D, or cache_<kind>_<scope>: every bundle of a scope",
    )
    url(p, positional=False)

    url(p := command("prune", cmd_prune))
    p.add_argument(
        "--older-than", type=parse_duration, metavar="AGE", help="30d, 12h, 45m (everything)"
    )
    p.add_argument(
        "--keep-newest",
        type=int,
        metavar="N",
        help="cache bundles: keep the newest N of each kind and scope, delete the rest",
    )
    p.add_argument("--dry-run", action="store_true", help="list what would be deleted")

    p = command("cp", cmd_cp)
    p.add_argument("src", metavar="SRC", help="store to copy from")
    p.add_argument("dst", metavar="DST", help="store to copy into (created if need be)")
    for side in ("src", "dst"):
        p.add_argument(
            f"--{side}-storage-options",
            dest=f"{side}_opts",
            metavar="JSON",
            help=f"for {side.upper()} (default: --storage-options)",
        )
    p.add_argument(
        "--trust-unsigned",
        action="store_true",
        help="into a local DST, copy compile artifacts that no accepted key signed too (they "
        "are code: a node installs unsigned ones from a local store without a key); default: "
        "signed ones only",
    )

    url(p := command("stats", cmd_stats))
    p.add_argument("--json", action="store_true", help="machine-readable output")

    url(p := command("doctor", cmd_doctor))
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = command("fingerprint", cmd_fingerprint)
    p.add_argument("factors", metavar="FACTORS.json", help="a JSON file of factors, - for stdin")

    url(p := command("explain", cmd_explain))
    p.add_argument(
        "--factors",
        required=True,
        metavar="FILE",
        help="the node's factors: a JSON object, a record (show --json) or the file the vLLM "
        "plugin writes on a miss; - for stdin",
    )
    p.add_argument(
        "--limit", type=_positive, default=NEAREST, metavar="N", help="plans listed (default 5)"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")

    add_cache_command(sub, common)
    add_run_command(sub, common)
    return parser


def _one_store(args: argparse.Namespace) -> None:
    """Set ``args.url`` to the store given as the operand ``URL`` or as ``--url`` (None:
    neither); ``CliError`` if both are given, with different values."""
    operand = vars(args).pop("url_operand", None)
    if operand is None:
        return
    if args.url is not None and args.url != operand:
        raise CliError(
            f"{args.command}: the store is given twice, as URL {without_userinfo(operand)!r} "
            f"and as --url {without_userinfo(args.url)!r}: give it once"
        )
    args.url = operand


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status: 0 done; 1 findings (``verify``,
    ``doctor``, ``show`` of an invalid, unreadable or vanished record, ``cache pull`` refusing
    what it found) or standard output closed under the command (a broken pipe); 2 a failure
    (one error line), or the command not done within ``--timeout`` (one error line; the
    command's daemon thread is not waited for); 130 on Ctrl-C while waiting for it; ``run``:
    its program's exit status (128 + N where a signal N killed it). Arguments
    argparse rejects raise its ``SystemExit(2)`` (usage on stderr), ``--help`` and
    ``--version`` its ``SystemExit(0)``."""
    args = build_parser().parse_args(argv)
    if getattr(args, "main_thread", False):  # run: a program's own time, signals handled
        return _run(args)
    command = background.start(lambda: _run(args), "plancache-command")
    try:
        done = command.join(args.timeout)
    except KeyboardInterrupt:
        return 130
    if not done:
        _report(f"{args.command}: not done within {args.timeout:g} s", args)
        return 2
    return command.wait(0)


def console() -> NoReturn:
    """The ``plancache`` executable: ``main()``, then exit at once with its status, without
    waiting for any thread a stuck call left behind (output flushed first)."""
    code = main()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def _run(args: argparse.Namespace) -> int:
    """Run the command ``args`` name; its exit status. Any failure prints one error line
    (with ``--debug``, the traceback before it; both without secrets) and returns 2."""
    func: Callable[[argparse.Namespace], int] = args.func
    args.opened = []  # stores to close on the way out
    args.keyring = None  # read on first use
    try:
        _one_store(args)
        return func(args)
    except BrokenPipeError:  # e.g. `plancache ls | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except Exception as exc:  # anything else: one line, whatever raised it
        if args.debug:
            for line in _scrub("".join(traceback.format_exception(exc)), args).splitlines():
                echo(line, file=sys.stderr)
        text = str(exc)
        if not (text and isinstance(exc, EXPECTED_ERRORS)):
            text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        _report(text, args)
        return 2
    finally:
        for store in args.opened:
            with contextlib.suppress(*EXPECTED_ERRORS):
                store.close()


def _report(message: str, args: argparse.Namespace) -> None:
    """Print ``message`` as the command's one error line."""
    echo(f"plancache: error: {_scrub(message, args)}", file=sys.stderr)
