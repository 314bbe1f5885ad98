"""Compile artifacts: vLLM's torch.compile AOT directories shared through plancache's stores.

An *artifact* is what one rank of a vLLM engine needs to load its compiled model instead of
compiling it: the files of ``<VLLM_CACHE_ROOT>/torch_compile_cache/torch_aot_compile/<key>/``
that belong to that rank (``rank_<r>_<dp>/`` and the shared ``inductor_cache/``). It is
stored as one object per (key, rank), ``compile_artifact_<key>_<rank>.tar``: a tar stream
(zstd-compressed when ``zstandard`` is importable) whose first member is a manifest listing
every file with its size, sha256 and mode, optionally signed. Loading an artifact executes
code (unpickling, ``.so`` files): only trusted artifacts are installed (``trust``).

Kinds on the object layer (``plancache._objects``): an encoding and a policy each
(create-if-absent, trust); nothing here knows a backend. Modules: ``manifest`` (the
manifest, names, signatures: pure), ``trust`` (the one trust rule, typed refusals),
``packing`` (pack a directory into a stream), ``archive`` (verify a stream and install it
atomically), ``claims`` and ``pacing`` (upload claims; deadlines and pace), ``engine``
(settings, sources, the one read loop and write, on the stack ``Settings.open_store``
builds), ``kind`` (a kind declared as a value), one module per kind (``compiled``,
``bundles``, ``modelinfo``, ``reports``: each declares its ``Kind``), ``registry`` (the one
registry the inventory and the commands iterate over), ``store`` (``ArtifactStore``, the
engine with each kind's operations by composition); the inventory is
``plancache._inventory.artifacts``. Importing this package imports no client library.
"""
