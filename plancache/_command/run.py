"""``plancache run [--kind inductor,triton] [--url URL] -- CMD ...``: run a program with its
generated caches shared, in one line.

Before the program starts, every trusted bundle of each kind (default ``inductor``) is
pulled into the directory the program will use (``TORCHINDUCTOR_CACHE_DIR`` or torch's
default; ``TRITON_CACHE_DIR`` or ``~/.triton/cache``; a kind of your own: ``--dir``), scoped
as ``cache pull --kind`` scopes it; once it has ended, what it added is pushed as one bundle
a kind (the push of ``cache push``, from the paths the pull listed).

Guarantees:

- the program's exit status is the command's (killed by signal N: 128 + N); plancache never
  fails the program: a store that fails, a setting that is wrong or a kind that cannot be
  scoped here is one line on stderr and the program runs as without plancache (fail-open);
- the first line (stderr) names the store and whether anything leaves this machine; every
  line of plancache's is on stderr, the program's output is its own;
- SIGTERM and SIGHUP are forwarded to the program; once it has ended, its caches are pushed
  all the same. SIGINT is left to the program (a terminal sends it to both): the program
  starts with the disposition plancache was given (ignored in a shell's background job);
- bounded: each pull by ``PLANCACHE_COMPILE_TIMEOUT`` (unset: ``--timeout``, as for
  ``cache pull``), the pushes by ``PLANCACHE_COMPILE_EXIT_WAIT`` in all (then abandoned:
  nothing stored); the program itself by nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from types import FrameType

from plancache._command.caches import _cache, _share, parse_factor, pulled_text, pushed_text
from plancache._command.display import echo
from plancache._redaction import without_userinfo
from plancache.caches import CacheFetched, CacheShare, GeneratedCache
from plancache.errors import CliError

FORWARDED = (signal.SIGTERM, signal.SIGHUP)
"""The signals passed on to the program (SIGINT reaches it from the terminal itself)."""
NOT_FOUND = 127
"""The exit status of a program that cannot be started (as a shell's)."""
_HELP = (
    "run a program with its generated caches shared: pull them before it starts, push what it "
    "added once it ends (also after SIGTERM); its exit status is kept"
)

_EPILOG = (
    "For run, --timeout bounds each pull (PLANCACHE_COMPILE_TIMEOUT wins where set), the pushes "
    "PLANCACHE_COMPILE_EXIT_WAIT in all; the program runs as long as it runs. SIGTERM and SIGHUP "
    "are forwarded to it; its exit status is the command's."
)


def parse_kinds(text: str) -> tuple[str, ...]:
    """``inductor,triton`` as a tuple of kinds, each once (argparse type)."""
    kinds = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    if not kinds:
        raise argparse.ArgumentTypeError(f"{text!r:.80}: no kind (inductor, triton, ...)")
    return kinds


def add_run_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Add ``run`` to the command's subparsers ``sub`` (``common``: every subcommand's
    options)."""
    p = sub.add_parser("run", parents=[common], help=_HELP, description=_HELP, epilog=_EPILOG)
    p.set_defaults(func=cmd_run, main_thread=True)
    p.add_argument(
        "--kind",
        type=parse_kinds,
        default=("inductor",),
        metavar="KINDS",
        help="the caches to share: inductor, triton or inductor,triton (default: inductor); "
        "or one kind of your own with --dir and --factor, as for cache push",
    )
    p.add_argument("--dir", metavar="DIR", help="a kind of your own: its cache directory")
    p.add_argument(
        "--factor",
        action="append",
        type=parse_factor,
        default=[],
        metavar="K=V",
        help="a kind of your own: what its files depend on, one K=V each",
    )
    p.add_argument(
        "--url",
        "--store",
        dest="url",
        metavar="URL",
        help="store URL or local path (default: $PLANCACHE_URL, else the local default)",
    )
    p.add_argument(
        "--gpu",
        metavar="NAME",
        help="the GPU the caches are for, as plancache names it (default: this machine's)",
    )
    p.add_argument(
        "--trust-unsigned",
        action="store_true",
        help="with no key configured, install unsigned bundles from a remote store too",
    )
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="-- CMD ...")


def cmd_run(args: argparse.Namespace) -> int:
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        raise CliError("run: no program: plancache run [options] -- CMD ...")
    opened = _opened(args)
    pulled: list[tuple[GeneratedCache, CacheFetched]] = []
    if opened is not None:
        share, caches, shown = opened
        for cache in caches:
            fetched = share.pull(cache)
            pulled.append((cache, fetched))
            echo(f"plancache: {pulled_text(cache, fetched, shown)}", file=sys.stderr)
    code = _program(program)
    if opened is not None and code != NOT_FOUND:
        _push(opened[0], pulled, opened[2])
    return code


def _opened(args: argparse.Namespace) -> tuple[CacheShare, list[GeneratedCache], str] | None:
    """The store and the caches the arguments name; None, said in one line, where either
    cannot be had (the program then runs without plancache)."""
    try:
        share, url = _share(args)
        if len(args.kind) > 1 and (args.dir or args.factor):
            raise CliError("--dir and --factor name one kind of your own, not several")
        caches = [
            _cache(argparse.Namespace(**{**vars(args), "kind": k}), must_exist=False)
            for k in args.kind
        ]
    except Exception as exc:  # fail-open: the program runs as without plancache
        text = f"{type(exc).__name__}: {exc}"
        if args.keyring is not None:
            text = args.keyring.scrub(text)
        echo(
            f"plancache: run: caches not shared ({text}): the program runs without them",
            file=sys.stderr,
        )
        return None
    return share, caches, without_userinfo(url)


@contextlib.contextmanager
def _forwarding() -> Iterator[Callable[[subprocess.Popen[bytes]], None]]:
    """While the block runs, SIGTERM and SIGHUP go to the child the block names by calling
    what it yields (those that arrived before are sent then), and SIGINT is ignored here (a
    terminal sends it to the program too); the handlers before are restored after."""
    children: list[subprocess.Popen[bytes]] = []
    pending: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        if not children:
            pending.append(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            children[0].send_signal(signum)

    def started(child: subprocess.Popen[bytes]) -> None:
        children.append(child)
        before[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)  # not inherited
        for signum in pending:
            forward(signum, None)

    before = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        yield started
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _program(program: Sequence[str]) -> int:
    """Run ``program`` to its end, the signals forwarded from before it starts; its exit
    status (killed by signal N: 128 + N)."""
    with _forwarding() as started:
        try:
            child = subprocess.Popen(list(program))
        except OSError as exc:
            echo(f"plancache: run: {program[0]!r:.200}: {exc.strerror or exc}", file=sys.stderr)
            return NOT_FOUND
        started(child)
        code = child.wait()
    return 128 - code if code < 0 else code


def _push(share: CacheShare, pulled: list[tuple[GeneratedCache, CacheFetched]], shown: str) -> None:
    """Push what the program added to each cache, within ``exit_wait`` seconds in all."""
    deadline = time.monotonic() + share.exit_wait
    for cache, fetched in pulled:
        pushed = share.push_within(cache, fetched.known, deadline - time.monotonic())
        if pushed is None:
            continue  # logged
        if pushed.files and "store" not in pushed.written:
            text = f"{cache.kind} cache {cache.root}: not written to the store {shown}"
        else:
            text = pushed_text(cache, pushed, shown)
        echo(f"plancache: {text}", file=sys.stderr)
