"""``ArtifactStore``: every kind loaded as code or trusted as fact (compile artifacts, cache
bundles, model info) and the boot reports on the configured stores, behind one object.

It is the ``Engine`` (settings, sources, the one read loop and write, the trust rule) with
each kind's operations (``compiled``, ``bundles``, ``modelinfo``); it adds no rule of its
own: every guarantee is the engine's, the trust rule's or a kind's.
"""

from __future__ import annotations

from plancache._artifacts.bundles import CacheBundles
from plancache._artifacts.compiled import CompileArtifacts
from plancache._artifacts.compiled import artifact_id as artifact_id
from plancache._artifacts.compiled import as_observation as as_observation
from plancache._artifacts.engine import DEFAULT_EXIT_WAIT_S as DEFAULT_EXIT_WAIT_S
from plancache._artifacts.engine import DEFAULT_FETCH_S as DEFAULT_FETCH_S
from plancache._artifacts.engine import CompileSettings as CompileSettings
from plancache._artifacts.engine import Fetched as Fetched
from plancache._artifacts.engine import Uploads as Uploads
from plancache._artifacts.modelinfo import ModelInfoKind
from plancache._artifacts.reports import ReportKind

# The names above, re-exported, are those of 0.3.0's ``plancache.artifacts.share`` (whose
# deprecated path imports this module: ``plancache._moved``), except ``MARKS_DIR``
# (``compiled.ARTIFACT_MARKS_DIR``).


class ArtifactStore(CompileArtifacts, CacheBundles, ModelInfoKind, ReportKind):
    """The kinds on the configured stores: ``fetch``, ``upload``, ``stored_manifest``,
    ``retract`` and ``judge`` (compile artifacts), ``fetch_cache`` and ``upload_cache``
    (cache bundles), ``fetch_model_info`` and ``upload_model_info`` (model info),
    ``upload_report`` (boot reports), and the
    engine's ``refusal``, ``store``, ``local``, ``keyring``, ``compile``, ``remote`` and
    ``close``."""
