"""sessions_app's module structure: no import cycle between its modules, never an import of
compaction_app (which reaches sessions_app through signals), and its tasks import what they
call, never the REST layer. Imports inside functions count as much as those at the top."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sessions_app

pytestmark = pytest.mark.profile_independent

ROOT = Path(sessions_app.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = ("sessions_app", *path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(path: Path) -> set[str]:
    """Every absolute module name `path` imports (`from a import b` names a.b and a)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: {other for other in _imports(path) if other in modules and other != name}
        for name, path in modules.items()
    }


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph`, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for other in sorted(graph[name]):
            if state.get(other) == 1:
                return [*path[path.index(other) :], other]
            if other not in state and (found := visit(other)):
                return found
        path.pop()
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state and (found := visit(name)):
            return found
    return None


def test_it_has_no_import_cycle_between_its_modules():
    assert _cycle(_graph()) is None


def test_it_finds_a_cycle_when_there_is_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_it_never_imports_compaction_app():
    offenders = {
        name: sorted(other for other in _imports(path) if other.split(".")[0] == "compaction_app")
        for name, path in _modules().items()
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_it_keeps_its_tasks_off_the_rest_layer():
    assert not {name for name in _imports(ROOT / "tasks.py") if name.startswith("sessions_app.api")}
