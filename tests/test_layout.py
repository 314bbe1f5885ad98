"""docs/layout.md describes the package as built: every module listed once, in an order in
which each module imports only modules listed above it; internal modules are private."""

from __future__ import annotations

import ast
import re
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
