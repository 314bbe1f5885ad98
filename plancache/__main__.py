"""``python -m plancache``: the ``plancache`` command."""

from plancache._command.cli import console

console()
