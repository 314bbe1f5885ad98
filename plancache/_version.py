"""The version of plancache (a leaf: every layer may name it)."""

__version__ = "0.3.0"
