"""A stand-in ``vllm`` package: put this folder on a child's path to import it as ``vllm``."""
