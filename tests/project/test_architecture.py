"""The import graph of the project's own code (config, sessions_app, compaction_app).

Every module is parsed (not imported) and its imports resolved to the project modules they
load. An import at a module's top level runs when the module is first imported; one inside a
function runs when the function is called: both are dependencies, so a cycle through either
kind fails (a function-level import that only dodges a circular import is still a circle in
the design). Imports under `if TYPE_CHECKING:` never run and are left out of the cycle check.

The rules:
- no import cycle;
- sessions_app never imports compaction_app (compaction builds on the ledger, not the reverse);
- a Celery `tasks` module never imports an `api` module (a task takes ids and calls a service;
  the REST layer is not its business);
- the gateway and the fitting core never import compaction_app.api (they read typed outcomes,
  not the API's dicts);
- only sessions_app writes the ledger: nothing in compaction_app (the gateway included) calls a
  write method on a sessions_app model, its manager or one of its instances; it calls the
  services in sessions_app/services.py.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.profile_independent

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("config", "sessions_app", "compaction_app")

# Cycles tolerated for now: none (each entry would be the set of modules tangled together).
KNOWN_CYCLES: set[frozenset[str]] = set()


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    # "module": runs on import; "function": runs when the enclosing function is called;
    # "type-checking": never runs.
    kind: str


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _project_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            modules[_module_name(path)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The most specific project module `name` loads (`a.b.C` → `a.b` when C is not a module)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []

    def add(name: str, line: int, kind: str) -> None:
        target = _resolve(name, modules)
        if target is not None and target != module:
            found.append(Import(module, target, line, kind))

    def visit(node: ast.AST, kind: str) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno, kind)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # `from pkg import mod` loads pkg.mod when it is a module, else pkg itself.
                add(f"{base}.{alias.name}" if alias.name != "*" else base, node.lineno, kind)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, "type-checking")
            for child in node.orelse:
                visit(child, kind)
            return
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            kind = "type-checking" if kind == "type-checking" else "function"
        for child in ast.iter_child_nodes(node):
            visit(child, kind)

    visit(tree, "module")
    return found


def _all_imports() -> list[Import]:
    modules = _project_modules()
    return [imp for name, path in modules.items() for imp in _imports_of(name, path, modules)]


def _cycles(imports: list[Import]) -> list[tuple[frozenset[str], list[Import]]]:
    """Every group of modules that import each other (a strongly connected component of the
    graph), each with the shortest cycle through its alphabetically first module."""
    graph: dict[str, dict[str, Import]] = {}
    for imp in imports:
        if imp.kind == "type-checking":
            continue
        edges = graph.setdefault(imp.source, {})
        # Prefer reporting a module-level edge: that one would break at import time.
        if imp.target not in edges or edges[imp.target].kind == "function":
            edges[imp.target] = imp
        graph.setdefault(imp.target, {})

    # Tarjan's strongly connected components.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            connect(node)

    cycles = []
    for group in groups:
        # The shortest way back to the group's first module, through the group only.
        start = min(group)
        paths: dict[str, list[Import]] = {start: []}
        frontier = [start]
        cycle: list[Import] | None = None
        while frontier and cycle is None:
            following = []
            for node in frontier:
                for target, imp in sorted(graph[node].items()):
                    if target == start:
                        cycle = [*paths[node], imp]
                        break
                    if target in group and target not in paths:
                        paths[target] = [*paths[node], imp]
                        following.append(target)
                if cycle is not None:
                    break
            frontier = following
        assert cycle is not None
        cycles.append((frozenset(group), cycle))
    return cycles


def _describe(group: frozenset[str], cycle: list[Import]) -> str:
    path = " → ".join(
        [cycle[0].source]
        + [f"{imp.target} ({imp.source}:{imp.line}, {imp.kind}-level)" for imp in cycle]
    )
    return f"{path}\n    (modules tangled together: {', '.join(sorted(group))})"


def test_it_parses_every_module_and_finds_their_imports():
    imports = _all_imports()
    modules = _project_modules()
    assert "compaction_app.services" in modules
    assert any(
        imp.source == "compaction_app.tasks" and imp.target == "compaction_app.services"
        for imp in imports
    )


def test_it_finds_a_cycle_through_function_level_imports():
    # The checker itself: a circle closed by an import inside a function is reported.
    imports = [
        Import("pkg.a", "pkg.b", 1, "module"),
        Import("pkg.b", "pkg.c", 3, "module"),
        Import("pkg.c", "pkg.a", 7, "function"),
        Import("pkg.c", "pkg.d", 8, "type-checking"),
        Import("pkg.d", "pkg.c", 2, "module"),
    ]
    ((group, cycle),) = _cycles(imports)
    assert group == {"pkg.a", "pkg.b", "pkg.c"}
    assert [imp.source for imp in cycle] == ["pkg.a", "pkg.b", "pkg.c"]
    assert "pkg.a (pkg.c:7, function-level)" in _describe(group, cycle)


def test_it_has_no_import_cycle():
    cycles = [(g, c) for g, c in _cycles(_all_imports()) if g not in KNOWN_CYCLES]
    if cycles:
        pytest.fail("import cycles:\n" + "\n".join(_describe(g, c) for g, c in cycles))


def test_it_keeps_sessions_app_free_of_compaction_app():
    wrong = [
        f"{imp.source}:{imp.line} imports {imp.target}"
        for imp in _all_imports()
        if imp.source.split(".")[0] == "sessions_app"
        and imp.target.split(".")[0] == "compaction_app"
    ]
    assert wrong == []


def test_it_keeps_tasks_off_the_rest_layer():
    wrong = [
        f"{imp.source}:{imp.line} imports {imp.target}"
        for imp in _all_imports()
        if imp.source.split(".")[-1] == "tasks" and "api" in imp.target.split(".")
    ]
    assert wrong == []


def test_it_keeps_bench_and_tests_apart():
    """The benches and the tests share their generators and stand-ins through
    compaction_app.testkit; neither imports the other."""
    root = Path(__file__).resolve().parents[2]
    crossings = []
    for folder, other in (("bench", "tests"), ("tests", "bench")):
        for path in sorted((root / folder).rglob("*.py")):
            if "node_modules" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module]
                crossings += [
                    f"{path.relative_to(root)}:{node.lineno} imports {name}"
                    for name in names
                    if name == other or name.startswith(other + ".")
                ]
    assert crossings == []


def test_it_keeps_the_gateway_and_the_fitting_core_off_the_rest_layer():
    wrong = [
        f"{imp.source}:{imp.line} imports {imp.target} ({imp.kind}-level)"
        for imp in _all_imports()
        if (
            imp.source.startswith("compaction_app.gateway")
            or imp.source == "compaction_app.fitting"
        )
        and imp.target.startswith("compaction_app.api")
    ]
    assert wrong == []


# Methods that write through a manager, a queryset or an instance.
WRITE_METHODS = frozenset(
    {
        "update",
        "create",
        "delete",
        "save",
        "bulk_create",
        "bulk_update",
        "get_or_create",
        "update_or_create",
    }
)


def _ledger_models() -> frozenset[str]:
    """The model classes sessions_app/models.py defines."""
    tree = ast.parse((ROOT / "sessions_app" / "models.py").read_text(encoding="utf-8"))
    return frozenset(
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        and any(isinstance(base, ast.Attribute) and base.attr == "Model" for base in node.bases)
    )


def _root(node: ast.expr) -> tuple[ast.expr, list[str]]:
    """The start of an attribute/call chain (`Event.objects.filter(...).update` → `Event`) and
    the attribute names along it."""
    names = []
    while True:
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            return node, names


def _annotated_names(annotation: ast.expr | None) -> set[str]:
    if annotation is None:
        return set()
    return {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)} | {
        n.value for n in ast.walk(annotation) if isinstance(n, ast.Constant)
    }


def _ledger_writes(path: Path, models: frozenset[str]) -> list[str]:
    """Write calls in `path` on a sessions_app model: through its manager
    (`Event.objects.filter(...).update(...)`), or on an instance known to be one (a parameter
    annotated with the model, a name assigned from its manager, an attribute named after it
    such as `run.session`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "sessions_app.models"
        for alias in node.names
    }
    ledger = imported & models
    if not ledger:
        return []
    lowered = {name.lower() for name in ledger}
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
            continue
        instances = set()
        if not isinstance(function, ast.Module):
            for arg in [*function.args.args, *function.args.kwonlyargs]:
                if _annotated_names(arg.annotation) & ledger:
                    instances.add(arg.arg)
        for node in ast.walk(function):
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                root, _ = _root(node.value)
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if isinstance(root, ast.Name) and root.id in ledger:
                    instances |= {t.id for t in targets if isinstance(t, ast.Name)}
        for node in ast.walk(function):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in WRITE_METHODS
            ):
                continue
            receiver = node.func.value
            root, names = _root(receiver)
            through_manager = (
                isinstance(root, ast.Name) and root.id in ledger and "objects" in names
            )
            on_instance = node.func.attr in ("save", "delete") and (
                (isinstance(receiver, ast.Name) and receiver.id in instances)
                or (isinstance(receiver, ast.Attribute) and receiver.attr in lowered)
            )
            if through_manager or on_instance:
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
                found.append(f"{where}:{node.lineno} {ast.unparse(node.func)}(…)")
    return sorted(set(found))


def test_it_finds_writes_on_ledger_models(tmp_path):
    # The checker itself, on a module written for it.
    models = _ledger_models()
    assert {"Session", "Event", "Thread"} <= models
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from sessions_app.models import Event, Session, Thread\n"
        "def f(session: Session, other):\n"
        "    Event.objects.filter(pk=1).update(pinned=True)\n"
        "    thread = Thread.objects.get(pk=1)\n"
        "    thread.save()\n"
        "    session.save(update_fields=['name'])\n"
        "    other.run.session.save()\n"
        "    other.save()\n"
        "    Session.objects.filter(pk=1).first()\n"
        "    {}.update(a=1)\n",
        encoding="utf-8",
    )
    found = _ledger_writes(sample, models)
    assert [line.split(" ", 1)[0].rsplit(":", 1)[1] for line in found] == ["3", "5", "6", "7"]


def test_it_leaves_ledger_writes_to_sessions_app_services():
    models = _ledger_models()
    wrong = [
        line
        for path in sorted((ROOT / "compaction_app").rglob("*.py"))
        if "migrations" not in path.parts
        for line in _ledger_writes(path, models)
    ]
    assert wrong == []


# --- window arithmetic ----------------------------------------------------------------------
# How full a window is (percentUsed, nearLimit, atLimit, the level fitting and the auto trigger
# decide on, the tokens left before a threshold) is computed in one function,
# sessions_app.context_window.window_level; where a compaction aims (the target, the summary's
# bound, the room rule) in one policy module, compaction_app/policy.py. Elsewhere a threshold
# or a target ratio is never compared, multiplied or divided, and tokens are never divided by
# a window: two surfaces computing "how full" apart is how they came to disagree.
WINDOW_MODULES = {"sessions_app/context_window.py", "compaction_app/policy.py"}
_RATIOS = frozenset(
    {
        "compact_threshold",
        "hard_limit_threshold",
        "hard_threshold",
        "compact_ratio",
        "hard_ratio",
        "fit_target_ratio",
        "target_ratio",
    }
)
_WINDOWS = frozenset({"context_limit", "limit", "window"})


def _terminal(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _window_arithmetic(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.Compare):
            operands = (node.left, *node.comparators)
            ordering = all(isinstance(op, ast.Lt | ast.LtE | ast.Gt | ast.GtE) for op in node.ops)
            # A ratio checked against constants (`0 < ratio <= 1`) is input validation.
            measured = any(
                not isinstance(o, ast.Constant) and _terminal(o) not in _RATIOS for o in operands
            )
            if ordering and measured and any(_terminal(o) in _RATIOS for o in operands):
                what = "compares a threshold"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult | ast.Div):
            if _terminal(node.left) in _RATIOS or _terminal(node.right) in _RATIOS:
                what = "scales by a threshold"
            elif isinstance(node.op, ast.Div) and _terminal(node.right) in _WINDOWS:
                named = {_terminal(n) or "" for n in ast.walk(node.left)}
                if any("token" in name for name in named):
                    what = "divides tokens by a window"
        if what:
            where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
            found.append((node.lineno, f"{where}:{node.lineno} {what}: {ast.unparse(node)}"))
    return [line for _, line in sorted(found)]


def test_it_finds_window_arithmetic(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f(session, settings, tokens, limit):\n"
        "    a = session.context_tokens / session.context_limit\n"
        "    b = a >= settings.compact_threshold\n"
        "    c = int(limit * settings.hard_limit_threshold)\n"
        "    d = settings.fit_target_ratio * limit\n"
        "    e = tokens / 4\n",
        encoding="utf-8",
    )
    lines = [line.split(" ", 1)[0].rsplit(":", 1)[1] for line in _window_arithmetic(sample)]
    assert lines == ["2", "3", "4", "5"]


def test_it_keeps_window_arithmetic_in_one_place():
    wrong = [
        line
        for package in ("sessions_app", "compaction_app")
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts and str(path.relative_to(ROOT)) not in WINDOW_MODULES
        for line in _window_arithmetic(path)
    ]
    assert wrong == []
