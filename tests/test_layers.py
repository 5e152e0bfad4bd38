"""The serving core is layered: no import circle in splavu_core, pipeline or assets.

Every import counts, at module level or inside a function: an import moved into a function hides a circle from
Python's loader, not from the design. The graph is read from the source (AST), so nothing is imported here.

The last circle, publish -> neighbors -> evaluation.suite -> catalog -> publish, went when versions, verdicts and
promotions moved into the bottom-layer splavu_core/ledger.py (issue 19) and index pruning moved from publish's
retention to its caller (anonymized_features).
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("splavu_core", "pipeline", "assets")


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = f
    return out


def imports_of(name: str, path: Path, known: dict) -> set[str]:
    """Every project module `name` imports, anywhere in its file (resolved to the deepest module that exists)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module
            targets = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t not in known and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in known and t != name:
                found.add(t)
    return found


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_imports_inside_functions():
    """The reader itself: a function-level relative import is an edge (publish imports aam.io only inside
    _load_checked_adapter)."""
    known = modules()
    assert "splavu_core.aam.io" in imports_of("splavu_core.publish", known["splavu_core.publish"], known)
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_no_import_circle():
    known = modules()
    found = cycles({name: imports_of(name, path, known) for name, path in known.items()})
    assert not found, f"import circles: {[sorted(c) for c in found]}"
