"""``python -m plancache``: the ``plancache`` command."""

from plancache.cli import main

raise SystemExit(main())
