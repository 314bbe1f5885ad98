"""Compile artifacts: vLLM's torch.compile AOT directories shared through plancache's stores.

An *artifact* is what one rank of a vLLM engine needs to load its compiled model instead of
compiling it: the files of ``<VLLM_CACHE_ROOT>/torch_compile_cache/torch_aot_compile/<key>/``
that belong to that rank (``rank_<r>_<dp>/`` and the shared ``inductor_cache/``). It is
stored as one object per (key, rank), ``compile_artifact_<key>_<rank>.tar``: a tar stream
(zstd-compressed when ``zstandard`` is importable) whose first member is a manifest listing
every file with its size, sha256 and mode, optionally signed. Loading an artifact executes
code (unpickling, ``.so`` files): only trusted artifacts are installed (``share``).

A kind on the object layer (``plancache._objects``): its encoding is the tar stream, its
policy create-if-absent and trust; nothing here knows a backend. Modules: ``manifest`` (the
manifest, names, signatures: pure), ``archive`` (pack a directory into a stream; verify a
stream and install it atomically), ``share`` (settings, trust, fetch and upload, on the
stack ``Settings.open_store`` builds), ``inventory`` (list, verify, copy, prune). Importing
this package imports no client library.
"""
