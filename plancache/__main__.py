"""``python -m plancache``: the ``plancache`` command."""

from plancache.cli import console

console()
