"""The ``plancache`` command: arguments (``cli``), the subcommands on plans (``plans``) and
on compile artifacts (``artifacts``), how they print (``display``), and ``doctor``."""
