"""The serving core is layered: no import circle in splavu_core, pipeline or assets.

Every import counts, at module level or inside a function: an import moved into a function hides a circle from
Python's loader, not from the design. The graph is read from the source (AST), so nothing is imported here.

The last circle, publish -> neighbors -> evaluation.suite -> catalog -> publish, went when versions, verdicts and
promotions moved into the bottom-layer splavu_core/store/ledger.py (issue 19) and index pruning moved from publish's
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
    assert "splavu_core.aam.io" in imports_of("splavu_core.publish.anonymized_tables", known["splavu_core.publish.anonymized_tables"], known)
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_no_import_circle():
    known = modules()
    found = cycles({name: imports_of(name, path, known) for name, path in known.items()})
    assert not found, f"import circles: {[sorted(c) for c in found]}"


# ---------------------------------------------------------------- one direction: splavu_core < assets < pipeline

LAYER = {"splavu_core": 0, "assets": 1, "pipeline": 2}


def upward_imports(known: dict) -> list[str]:
    """`a -> b` for every import of a module from a package above the importer's."""
    return sorted(f"{name} -> {t}" for name, path in known.items() for t in imports_of(name, path, known)
                  if LAYER[t.split(".")[0]] > LAYER[name.split(".")[0]])


def test_the_upward_reader_sees_an_upward_import():
    assert upward_imports({"assets.a": _source("from pipeline.b import x\n"), "pipeline.b": _source(""),
                           "splavu_core.c": _source("import assets.a\n")}) == ["assets.a -> pipeline.b",
                                                                               "splavu_core.c -> assets.a"]


def test_layers_point_one_way():
    """assets/ never imports pipeline/, splavu_core/ neither of them (resources and partitions live in assets/)."""
    found = upward_imports(modules())
    assert not found, f"upward imports: {found}"


# ---------------------------------------------------------------- splavu_core's stages, in data-flow order

# A stage imports its own modules and the stages before it, never one after it (function-level imports included).
STAGES = ("settings", "threads", "store", "ingest", "extract", "tasks", "aam", "publish", "serve", "evaluation",
          "forget")


def stage_of(module: str) -> str:
    return module.split(".")[1]


def backward_imports(known: dict) -> list[str]:
    """`a -> b` for every splavu_core import of a later stage than the importer's."""
    core = {n: p for n, p in known.items() if n.startswith("splavu_core.")}
    return sorted(f"{name} -> {t}" for name, path in core.items() for t in imports_of(name, path, known)
                  if t.startswith("splavu_core.") and STAGES.index(stage_of(t)) > STAGES.index(stage_of(name)))


def test_the_stage_reader_sees_a_later_stage():
    known = {"splavu_core.store.fs": _source("from splavu_core.publish.anonymized_tables import x\n"),
             "splavu_core.publish.anonymized_tables": _source("from splavu_core.store.fs import y\n")}
    assert backward_imports(known) == ["splavu_core.store.fs -> splavu_core.publish.anonymized_tables"]


def test_every_module_belongs_to_a_stage():
    strays = sorted(n for n in modules() if n.startswith("splavu_core.") and stage_of(n) not in STAGES)
    assert not strays, f"modules outside the stages {STAGES}: {strays} (put each in the stage it serves)"


def test_stages_point_one_way():
    found = backward_imports(modules())
    assert not found, f"imports of a later stage: {found}"


# ---------------------------------------------------------------- dagster's public API only

# The only private Dagster imports: the dask workaround subclasses the context DaskExecutor.execute type-checks
# (pipeline/dask_engine.py says why); the CLI's runs are created with the code location's origin, as `dagster job
# launch` creates them, and executed in-process, as a run worker does (pipeline/launch.py says why: no public API
# does both). Nothing else may join this list.
PRIVATE_DAGSTER_ALLOWED = {("pipeline.dask_engine", "dagster._core.execution.context.system"),
                           ("pipeline.launch", "dagster._core.execution.api"),
                           ("pipeline.launch", "dagster._core.remote_origin"),
                           ("pipeline.launch", "dagster._core.snap"),
                           ("pipeline.launch", "dagster._core.workspace.load")}


def private_dagster_imports(name: str, path: Path) -> set[tuple[str, str]]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
        mods += [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) and \
            node.module and not node.level else []
        for m in mods:
            parts = m.split(".")
            if parts[0].startswith("dagster") and any(p.startswith("_") for p in parts[1:]):
                found.add((name, ".".join(parts[:next(i for i, p in enumerate(parts) if p.startswith("_")) + 1])
                           if isinstance(node, ast.Import) else node.module))
    return found


def test_the_dagster_reader_sees_a_private_import():
    path = _source("import dagster._check as check\nfrom dagster._core.errors import E\nfrom dagster import _x\n"
                   "from dagster_k8s import k8s_job_executor\n")
    assert private_dagster_imports("m", path) == {("m", "dagster._check"), ("m", "dagster._core.errors"),
                                                  ("m", "dagster")}


def test_no_private_dagster_import():
    found = set().union(*(private_dagster_imports(n, p) for n, p in modules().items()))
    assert found == PRIVATE_DAGSTER_ALLOWED, f"private dagster imports beyond the allowed one: " \
                                             f"{sorted(found - PRIVATE_DAGSTER_ALLOWED)}"
    configs = [ROOT / "dagster.yaml", *(ROOT / "deploy").rglob("*.yaml")]
    named = [f"{f.relative_to(ROOT)}: {line.strip()}" for f in configs for line in f.read_text().splitlines()
             if "dagster._" in line.split("#")[0]]
    assert not named, f"instance configs naming private dagster modules: {named}"


# ---------------------------------------------------------------- no private helper across modules

def private_names_used(name: str, path: Path, known: dict) -> list[str]:
    """`module._name` uses of another project module: `from m import _x`, or `alias._x` of an imported module."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    tree, found, aliases = ast.parse(path.read_text()), [], {}

    def resolve(node) -> str:
        return ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else [])) \
            if node.level else node.module

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = resolve(node)
            for a in node.names:
                full = f"{base}.{a.name}"
                if full in known:
                    aliases[a.asname or a.name] = full
                elif base in known and base != name and a.name.startswith("_") and not a.name.startswith("__"):
                    found.append(f"{name}: from {base} import {a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known:
                    aliases[a.asname or a.name] = a.name if a.asname else a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            target = aliases.get(ast.unparse(node.value))
            if target and target != name:
                found.append(f"{name}: {target}.{node.attr}")
    return found


def test_the_private_name_reader_sees_both_forms():
    known = {"p.a": None, "p.b": None}
    path = _source("from .a import _x, y\nfrom . import a\nimport p.b as pb\na._y()\npb._z\n")
    assert sorted(private_names_used("p.c", path, known)) == ["p.c: from p.a import _x", "p.c: p.a._y", "p.c: p.b._z"]


def test_no_private_helper_is_imported_across_modules():
    known = modules()
    found = [f for n, p in known.items() for f in private_names_used(n, p, known)]
    assert not found, f"private names used outside their module (make them public or move them): {found}"


def _source(text: str) -> Path:
    import tempfile
    f = Path(tempfile.mkdtemp()) / "m.py"
    f.write_text(text)
    return f
