"""Stand-in for the vllm package: only what plancache's plugin tests need."""

__version__ = "0.0.0+standin"
