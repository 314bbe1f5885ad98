"""The release as a user gets it (``tox -e release``): an sdist and a wheel built with
``python -m build``; the sdist holds the docs, the changelog and the licence; the wheel,
installed into a fresh virtual environment, runs ``plancache --version`` and the README's
quickstart (its Library example) with nothing else installed. Exit status 1 on any
difference, naming it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART_PRINTS = "hit 55834574848"
IN_SDIST = ("README.md", "CHANGELOG.md", "LICENSE", "docs/index.md", "docs/compile.md")


def run(*args: str | Path, cwd: Path = ROOT, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    if out.returncode:
        sys.exit(f"failed ({out.returncode}): {' '.join(map(str, args))}\n{out.stdout}{out.stderr}")
    return out.stdout


def quickstart() -> str:
    """The README's Library example: its first Python block."""
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"## Library\n.*?```python\n(.*?)```", readme, re.S)
    if found is None:
        sys.exit("README.md has no Python block under ## Library")
    return found.group(1)


def main(work: Path) -> None:
    dist = work / "dist"
    run(sys.executable, "-m", "build", "--outdir", dist, ROOT)
    (sdist,) = dist.glob("plancache-*.tar.gz")
    (wheel,) = dist.glob("plancache-*.whl")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    missing = [n for n in IN_SDIST if n not in names]
    if missing:
        sys.exit(f"{sdist.name} lacks {', '.join(missing)}")
    env_dir = work / "venv"
    venv.create(env_dir, with_pip=True, clear=True)
    python = env_dir / "bin" / "python"
    run(python, "-m", "pip", "install", "-q", wheel)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PLANCACHE_", "VLLM_"))}
    environ["VLLM_CACHE_ROOT"] = str(work / "cache")
    version = run(env_dir / "bin" / "plancache", "--version", env=environ).strip()
    expected = re.search(r'__version__ = "(.+)"', (ROOT / "plancache/_version.py").read_text())
    if expected is None or expected.group(1) not in version:
        sys.exit(f"plancache --version printed {version!r}")
    script = work / "quickstart.py"
    script.write_text(quickstart())
    printed = run(python, script, cwd=work, env=environ)
    if QUICKSTART_PRINTS not in printed:
        sys.exit(f"the quickstart printed {printed!r}, not {QUICKSTART_PRINTS!r}")
    print(f"{sdist.name} and {wheel.name}: {version}; the quickstart printed {printed.strip()!r}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
