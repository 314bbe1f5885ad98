"""docs/layout.md describes the package as built: every module listed once, in an order in
which each module imports only modules listed above it; internal modules are private."""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "plancache"
ROW = re.compile(r"^\| `([\w/.]+\.py)` \|", re.M)
PUBLIC = {"errors.py", "caches.py", "__init__.py", "__main__.py"}
"""Top-level modules that are public (besides the plugin and the test kit packages)."""


def _listed() -> list[str]:
    return ROW.findall((ROOT / "docs" / "layout.md").read_text())


def _tree() -> list[str]:
    return sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py"))


def _dotted(rel: str) -> str:
    parts = ["plancache", *Path(rel).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(rel: str, known: dict[str, str]) -> set[str]:
    """The modules of the package (as listed) that ``rel`` imports, anywhere in the file."""
    found: set[str] = set()

    def add(name: str) -> None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and known[name] != rel:
            found.add(known[name])

    for node in ast.walk(ast.parse((PACKAGE / rel).read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("plancache"):
            for alias in node.names:
                add(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("plancache"):
                    add(alias.name)
    return found


def test_every_module_is_listed_once() -> None:
    listed = _listed()
    assert len(listed) == len(set(listed)), "listed twice: " + ", ".join(
        sorted({m for m in listed if listed.count(m) > 1})
    )
    assert sorted(listed) == _tree()


def test_each_module_imports_only_modules_listed_above_it() -> None:
    listed = _listed()
    known = {_dotted(rel): rel for rel in listed}
    above: set[str] = set()
    wrong = []
    for rel in listed:
        later = _imports(rel, known) - above
        if later:
            wrong.append(f"{rel} imports {', '.join(sorted(later))}, listed below it")
        above.add(rel)
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("rel", [r for r in _tree() if "/" not in r])
def test_internal_modules_are_private(rel: str) -> None:
    assert rel in PUBLIC or rel.startswith("_"), f"plancache/{rel} is neither public nor private"


def _private_names(tree: ast.AST) -> set[str]:
    """The private members a module defines: methods and class attributes named ``_x``, and
    ``self._x`` it assigns."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(item.name)
                elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                    targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                    names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and isinstance(node.ctx, ast.Store)
        ):
            names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_no_module_calls_a_private_member_of_another() -> None:
    """``x._name`` where ``x`` is not ``self`` or ``cls`` and ``_name`` is a private member
    that another module of the package defines (the plugin may reach vLLM's own)."""
    trees = {rel: ast.parse((PACKAGE / rel).read_text()) for rel in _tree()}
    defined = {rel: _private_names(tree) for rel, tree in trees.items()}
    offenders = []
    for rel, tree in trees.items():
        others = set().union(*(names for other, names in defined.items() if other != rel))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
                continue
            if node.value.id in {"self", "cls"} or node.attr in defined[rel]:
                continue
            if node.attr in others:
                offenders.append(f"{rel}:{node.lineno} {node.value.id}.{node.attr}")
    assert not offenders, "\n".join(offenders)


MAX_LINES = 500
ENGINE = [
    "_artifacts/engine.py",
    "_artifacts/trust.py",
    "_claims.py",
    "_artifacts/pacing.py",
]
"""The modules every kind shares: they know no backend (the stores' generic hooks serve)."""


def _kind_values() -> dict[str, set[str]]:
    """{module: the module-level names it binds to a registered kind} over the package."""
    from plancache._artifacts.registry import KINDS

    out: dict[str, set[str]] = {}
    for rel in _tree():
        if rel.startswith(("integrations/", "testing/")) or rel == "__main__.py":
            continue
        module = importlib.import_module(_dotted(rel))
        bound = {n for n, v in vars(module).items() if any(v is k for k in KINDS)}
        if bound:
            out[rel] = bound
    return out


KIND_MODULES = sorted(rel for rel in _kind_values() if rel.startswith("_artifacts/"))
"""One module per registered kind (each declares its ``Kind``), read from the registry."""


def test_no_module_is_over_the_line_cap() -> None:
    """The test kit aside, no module of the package holds more than ``MAX_LINES`` lines."""
    long = [
        f"{rel}: {n} lines"
        for rel in _tree()
        if not rel.startswith("testing/")
        and (n := len((PACKAGE / rel).read_text().splitlines())) > MAX_LINES
    ]
    assert not long, "\n".join(long)


def _known() -> dict[str, str]:
    return {_dotted(rel): rel for rel in _tree()}


@pytest.mark.parametrize("rel", ENGINE)
def test_the_engine_imports_no_backend(rel: str) -> None:
    backends = sorted(m for m in _imports(rel, _known()) if m.startswith("_backends/"))
    assert not backends, f"{rel} imports {', '.join(backends)}"


@pytest.mark.parametrize("rel", KIND_MODULES)
def test_a_kind_imports_no_other_kind(rel: str) -> None:
    others = sorted(_imports(rel, _known()) & (set(KIND_MODULES) - {rel}))
    assert not others, f"{rel} imports {', '.join(others)}"


def test_the_0_3_0_artifact_store_path_still_imports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``plancache.artifacts.share`` (0.3.0) names ``ArtifactStore``'s module, split since."""
    from plancache._artifacts.engine import CompileSettings, Fetched
    from plancache._artifacts.store import ArtifactStore

    monkeypatch.delitem(sys.modules, "plancache.artifacts.share", raising=False)
    with pytest.warns(DeprecationWarning, match="plancache.artifacts.share is deprecated"):
        old = importlib.import_module("plancache.artifacts.share")
    assert (old.ArtifactStore, old.CompileSettings, old.Fetched) == (
        ArtifactStore,
        CompileSettings,
        Fetched,
    )


STORE_MODULES = ["_forwarding.py", *sorted(str(p) for p in _tree() if p.startswith("_backends/"))]


@pytest.mark.parametrize("rel", STORE_MODULES)
def test_every_backend_and_wrapper_is_an_object_layer_only(rel: str) -> None:
    """Backends and the layers that wrap them implement ``ObjectLayer``; the plans kind is
    built on a layer (composition), never inherited by one. The one plans kind over two
    layers (``TieredStore``) is a ``PlanStore``, and no layer."""
    from plancache._objects import ObjectLayer
    from plancache._store import PlanStore

    module = importlib.import_module(_dotted(rel))
    classes = [
        c
        for c in vars(module).values()
        if isinstance(c, type)
        and c.__module__ == module.__name__
        and issubclass(c, (ObjectLayer, PlanStore))
    ]
    for cls in classes:
        assert not (issubclass(cls, ObjectLayer) and issubclass(cls, PlanStore)), cls
        if issubclass(cls, PlanStore):
            assert cls.__name__ == "TieredStore", f"{cls.__qualname__} inherits the plans kind"
    assert not issubclass(PlanStore, ObjectLayer)


def test_a_plan_store_reaches_its_layer_only_through_layer() -> None:
    """0.3.0's ``PlanStore`` was an object layer itself: its primitives still answer, with a
    ``DeprecationWarning`` naming ``layer``; anything else is an ``AttributeError``."""
    from plancache import PlanStore
    from plancache._backends.local import LocalStore

    store = PlanStore(LocalStore(ROOT / "docs"))
    with pytest.warns(DeprecationWarning, match=r"PlanStore.list_objects .* PlanStore.layer"):
        assert list(store.list_objects("layout.md")) == ["layout.md"]  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="root"):
        store.root  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(TypeError, match="not an ObjectLayer"):
        PlanStore(store)  # type: ignore[arg-type]


# -- one guarded handle, one foreign-writer rule (issue 42, mechanism 1) -----------------------
GUARDED = {"_directory.py", "_neighbours.py"}
"""The guarded handle's modules: the only ones that touch a directory another user could write
and the only home of the foreign-writer rule."""
FILE_CALLS = {"write_bytes", "write_text", "mkdir", "unlink", "stat"}
NOT_SHARED = {
    # (module, call): why it may: not on a directory another local user could write
    ("_breaker.py", "open"): "/proc/sys/kernel/random/boot_id, the kernel's",
    ("_command/fingerprint.py", "open"): "a file the user named on the command line",
    ("integrations/torch.py", ".write_bytes"): "a private directory of tempfile's",
    ("testing/servers.py", "open"): "the test kit's own server logs, in its private temp dir",
    ("testing/servers.py", "os.unlink"): "the test kit's own server logs",
}
RULE_EXCEPTIONS = {
    "_command/doctor.py": "a health report's finding (world-writable without the sticky bit)",
}


def file_calls(source: str) -> list[tuple[str, int]]:
    """(call, line) of each ``open(``, ``os.link``, ``os.unlink``, ``os.stat`` and each
    ``.write_bytes``, ``.write_text``, ``.mkdir``, ``.unlink``, ``.stat`` call in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id == "open":
            found.append(("open", node.lineno))
        elif isinstance(f, ast.Attribute):
            on_os = isinstance(f.value, ast.Name) and f.value.id == "os"
            if f.attr in FILE_CALLS:
                found.append((f"os.{f.attr}" if on_os else f".{f.attr}", node.lineno))
            elif f.attr == "link" and on_os:
                found.append(("os.link", node.lineno))
    return found


def foreign_rules(source: str) -> list[int]:
    """Lines of ``source`` that decide who could have written a file themselves: ``st_uid``
    compared with ``geteuid()``, or a mode masked with group or others' write bits."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            text = ast.unparse(node)
            if "st_uid" in text and "geteuid" in text:
                lines.append(node.lineno)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitAnd):
            text = ast.unparse(node)
            masks = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant)]
            writes = any(isinstance(m, int) and m & 0o022 for m in masks)
            if "st_mode" in text and (writes or "S_IWGRP" in text or "S_IWOTH" in text):
                lines.append(node.lineno)
    return lines


def _outside(rel: str) -> bool:
    return rel not in GUARDED


def test_no_module_touches_a_shared_directory_but_the_guarded_handle() -> None:
    """Outside ``_directory.py`` (and ``_neighbours.py``), no module calls ``open``,
    ``write_bytes``, ``write_text``, ``mkdir``, ``os.link``, ``unlink`` or ``stat`` but the
    (module, call) pairs ``NOT_SHARED`` lists, each with why it is not on a shared directory."""
    found = {
        f"{rel}:{line}: {call}"
        for rel in _tree()
        if _outside(rel)
        for call, line in file_calls((PACKAGE / rel).read_text())
        if (rel, call) not in NOT_SHARED
    }
    assert not found, "file calls outside the guarded handle:\n" + "\n".join(sorted(found))


def test_the_foreign_writer_rule_is_defined_once() -> None:
    found = [
        f"{rel}:{line}"
        for rel in _tree()
        if _outside(rel) and rel not in RULE_EXCEPTIONS
        for line in foreign_rules((PACKAGE / rel).read_text())
    ]
    assert not found, "a second foreign-writer rule (use _neighbours.foreign):\n" + "\n".join(found)
    assert foreign_rules((PACKAGE / "_neighbours.py").read_text())  # the one, found there


PLANTED = """
import os
from pathlib import Path

def keep(root: Path, data: bytes) -> None:
    (root / "explain").mkdir(exist_ok=True)
    (root / "explain" / "x.json").write_bytes(data)
    with open(root / "record.json", "rb") as f:
        f.read()
    os.link(root / "a", root / "b")
    (root / "old.json").unlink()

def trusted(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022
"""


def test_both_checks_flag_a_planted_module() -> None:
    assert sorted(call for call, _ in file_calls(PLANTED)) == sorted(
        [".mkdir", ".write_bytes", "open", "os.link", ".unlink"]
    )
    assert len(foreign_rules(PLANTED)) == 2  # the owner compared, the write bits masked


KIND_WORDS = {"name", "label", "prefix"}
"""A kind's attributes a command could dispatch on by comparing them with a kind's text."""


def _identifier(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")


def kind_dispatch(source: str, values: set[str], texts: set[str]) -> list[str]:
    """Where ``source`` names a kind: a module of a kind imported, a kind's value (any name
    in ``values``) used, something named ``kind`` compared with a constant (``kind is
    inventory.REPORTS``), or an attribute of ``KIND_WORDS`` compared with a kind's name,
    label or prefix (any of ``texts``)."""
    found = []
    kinds = {_dotted(rel) for rel in KIND_MODULES}
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.ImportFrom) and node.module:
            imported = {f"{node.module}.{a.name}" for a in node.names} | {node.module}
            found += [f"{line}: imports {m}" for m in sorted(imported & kinds)]
        elif isinstance(node, ast.Name | ast.Attribute) and _identifier(node) in values:
            found.append(f"{line}: names {_identifier(node)}")
        elif isinstance(node, ast.Compare):
            sides = [_identifier(s) for s in [node.left, *node.comparators]]
            constants = [s for s in [node.left, *node.comparators] if isinstance(s, ast.Constant)]
            identity = all(
                isinstance(op, ast.Is | ast.IsNot | ast.Eq | ast.NotEq) for op in node.ops
            )
            if (
                identity
                and any("kind" in s.lower() for s in sides)
                and any(s.isupper() for s in sides)
            ):
                found.append(f"{line}: compares a kind with a constant")
            if set(sides) & KIND_WORDS and any(c.value in texts for c in constants):
                found.append(f"{line}: compares a kind's name, label or prefix with its text")
    return found


def _kinds_known() -> tuple[set[str], set[str]]:
    from plancache._artifacts.registry import KINDS

    values = set().union(*_kind_values().values())
    texts = {t for k in KINDS for t in (k.name, k.label, k.prefix)}
    return values, texts


@pytest.mark.parametrize("rel", [r for r in _tree() if r.startswith("_command/")])
def test_the_commands_dispatch_on_no_kind(rel: str) -> None:
    """The commands iterate over the registry and ask each kind's value; none names a kind
    (no ``if kind is inventory.REPORTS``, no ``kind.name == "compile"``)."""
    found = kind_dispatch((PACKAGE / rel).read_text(), *_kinds_known())
    assert not found, f"{rel} dispatches on a kind: " + "; ".join(found)


@pytest.mark.parametrize(
    "planted",
    [
        "if kind is inventory.REPORTS:\n    pass",
        "if kind.name == 'boot-report':\n    pass",
        "every = ', every byte' if kind.label == 'compile artifact' else ''",
        "from plancache._artifacts.modelinfo import is_model_info_object_name",
        "from plancache._artifacts import reports",
        "rows = scan(layer, kind=MODEL_INFO)",
    ],
)
def test_the_dispatch_check_finds_a_planted_one(planted: str) -> None:
    assert kind_dispatch(planted, *_kinds_known())


# -- capabilities, not concrete types (issue 43, item 2) ---------------------------------------
def _backend_classes() -> set[str]:
    """The names of the classes ``plancache/_backends/`` defines that are object layers (the
    backends and the wrappers of one)."""
    from plancache._objects import ObjectLayer

    names = set()
    for rel in STORE_MODULES:
        if rel.startswith("_backends/"):
            module = importlib.import_module(_dotted(rel))
            names |= {
                c.__name__
                for c in vars(module).values()
                if isinstance(c, type)
                and c.__module__ == module.__name__
                and issubclass(c, ObjectLayer)
            }
    return names


def type_checks(source: str, classes: set[str]) -> list[str]:
    """Where ``source`` asks ``isinstance`` or ``issubclass`` of one of ``classes`` (alone,
    in a tuple or a union)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass")
            and len(node.args) == 2
        ):
            named = {_identifier(n) for n in ast.walk(node.args[1]) if isinstance(n, ast.expr)}
            found += [f"{node.lineno}: {node.func.id} {c}" for c in sorted(named & classes)]
    return found


def test_no_module_asks_a_backends_type_outside_the_backends() -> None:
    """Outside ``plancache/_backends/``, code asks a layer's capabilities
    (``ObjectLayer.probe_store``, ``local_directory``, ...), never which backend it is: a
    backend registered with ``register_backend`` gets what the built-in ones get."""
    classes = _backend_classes()
    assert {"LocalStore", "RemoteStore", "S3Store", "GCSStore", "CheckedLayer"} <= classes
    found = [
        f"{rel}:{where}"
        for rel in _tree()
        if not rel.startswith("_backends/")
        for where in type_checks((PACKAGE / rel).read_text(), classes)
    ]
    assert not found, "a backend's type asked (ask a capability):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "planted",
    [
        "if isinstance(store.layer, LocalStore):\n    pass",
        "remote = isinstance(store, _remote.RemoteStore)",
        "ok = isinstance(layer, (S3Store, GCSStore))",
        "ok = isinstance(layer, FsspecStore | CheckedLayer)",
        "ok = issubclass(type(layer), GuardedStore)",
    ],
)
def test_the_type_check_finds_a_planted_one(planted: str) -> None:
    assert type_checks(planted, _backend_classes())
