"""``ArtifactStore``: every kind loaded as code or trusted as fact (compile artifacts, cache
bundles, model info) and the boot reports on the configured stores, behind one object.

It is the ``Engine`` (settings, sources, the one read loop and write, the trust rule) with
each kind's operations built on it by composition (``compiled``, ``bundles``,
``model_info``, ``reports``: each an object holding the engine, none a subclass of it), and
their methods under the names callers have used since 0.3.0; it adds no rule of its own:
every guarantee is the engine's, the trust rule's or a kind's. A kind added since needs no
line here: its operations class is built on an engine where it is used.
"""

from __future__ import annotations

from plancache._artifacts.bundles import CacheBundles
from plancache._artifacts.compiled import CompileArtifacts
from plancache._artifacts.compiled import artifact_id as artifact_id
from plancache._artifacts.compiled import as_observation as as_observation
from plancache._artifacts.engine import CompileSettings as CompileSettings
from plancache._artifacts.engine import Engine
from plancache._artifacts.engine import Fetched as Fetched
from plancache._artifacts.engine import Uploads as Uploads
from plancache._artifacts.modelinfo import ModelInfoKind
from plancache._artifacts.reports import ReportKind
from plancache._config import Settings
from plancache._defaults import DEFAULT_EXIT_WAIT_S as DEFAULT_EXIT_WAIT_S
from plancache._defaults import DEFAULT_FETCH_S as DEFAULT_FETCH_S
from plancache._store import PlanStore

# The names above, re-exported, are those of 0.3.0's ``plancache.artifacts.share`` (whose
# deprecated path imports this module: ``plancache._moved``), except ``MARKS_DIR``
# (``compiled.ARTIFACT_MARKS_DIR``).


class ArtifactStore(Engine):
    """The kinds on the configured stores: ``fetch``, ``upload``, ``stored_manifest``,
    ``others``, ``retract`` and ``judge`` (compile artifacts), ``fetch_cache`` and
    ``upload_cache`` (cache bundles), ``fetch_model_info`` and ``upload_model_info`` (model
    info), ``upload_report`` (boot reports), and the engine's ``refusal``, ``store``,
    ``local``, ``keyring``, ``compile``, ``remote`` and ``close``."""

    def __init__(
        self, settings: Settings, compile: CompileSettings, store: PlanStore | None = None
    ) -> None:
        super().__init__(settings, compile, store)
        self.compiled = CompileArtifacts(self)
        self.bundles = CacheBundles(self)
        self.model_info = ModelInfoKind(self)
        self.reports = ReportKind(self)
        c = self.compiled
        self.fetch, self.upload, self.judge = c.fetch, c.upload, c.judge
        self.stored_manifest, self.others, self.retract = c.stored_manifest, c.others, c.retract
        self.fetch_cache, self.upload_cache = self.bundles.fetch_cache, self.bundles.upload_cache
        self.fetch_model_info = self.model_info.fetch_model_info
        self.upload_model_info = self.model_info.upload_model_info
        self.upload_report = self.reports.upload_report
