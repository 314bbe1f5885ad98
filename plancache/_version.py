"""The version of plancache (a leaf: every layer may name it)."""

__version__ = "0.5.0"

DEPRECATED_REMOVED_IN = "0.6.0"
"""The release that removes every name deprecated so far (each keeps working, with a
``DeprecationWarning`` naming this release, for at least one minor release: see the
CHANGELOG's deprecation policy; 0.5.0 was announced, and moved here so that 0.3.0
programs keep working)."""
