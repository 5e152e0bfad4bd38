"""The install is the lock (issue 48): the running environment holds every package of requirements.lock (or of
requirements-cuda.lock, by the torch build installed) at its locked version and nothing else; the lock agrees with
the files it is written from; pyproject.toml declares every third-party module the code imports."""
from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCKS = {"cpu": ROOT / "requirements.lock", "cuda": ROOT / "requirements-cuda.lock"}
PROJECT = "splavu"  # installed editable by `make setup`, not from the lock
FIX = "rebuild it from the lock: rm -rf .venv && make setup (TORCH=cuda for the CUDA build)"


def parse_lock(text: str) -> dict[str, tuple[str, str | None]]:
    """{name: (version, marker or None)} of a pip-format lock's `name==version [; marker]` entries; hash lines,
    comments and options are skipped. An entry that pins no single version is an error."""
    pins = {}
    for line in text.splitlines():
        if not line.strip() or line[0] in " \t#-":
            continue
        req = Requirement(line.rstrip("\\").strip())
        specs = list(req.specifier)
        if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
            raise ValueError(f"not a pinned lock entry: {line!r}")
        pins[canonicalize_name(req.name)] = (specs[0].version, str(req.marker) if req.marker else None)
    return pins


def lock_differences(pins: dict[str, tuple[str, str | None]], installed: dict[str, str],
                     environment: dict[str, str] | None = None, ignore: tuple[str, ...] = (PROJECT,)) -> list[str]:
    """One line per package, by name, where `installed` ({name: version}) differs from the lock: locked but missing,
    installed at another version (a local label such as +cpu counts), installed but not in the lock. An entry whose
    marker is false in `environment` (default: this interpreter's) belongs to another platform and is skipped."""
    have = {canonicalize_name(name): version for name, version in installed.items()}
    skip = {canonicalize_name(name) for name in ignore}
    out = []
    for name, (version, marker) in sorted(pins.items()):
        if marker and not Marker(marker).evaluate(environment):
            continue
        if name not in have:
            out.append(f"{name}: locked {version}, not installed")
        elif Version(have[name]) != Version(version):
            out.append(f"{name}: locked {version}, installed {have[name]}")
    out += [f"{name}: installed {have[name]}, not in the lock" for name in sorted(set(have) - set(pins) - skip)]
    return out


def installed_versions() -> dict[str, str]:
    """{name: version} of the distributions this interpreter imports from (the first on sys.path wins, as for imports)."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        if dist.metadata["Name"]:
            found.setdefault(canonicalize_name(dist.metadata["Name"]), dist.version)
    return found


def lock_for(installed: dict[str, str]) -> Path:
    """The lock whose torch build is the one installed (CPU or CUDA); the default CPU lock when neither is."""
    for path in LOCKS.values():
        if parse_lock(path.read_text())["torch"][0] == installed.get("torch"):
            return path
    return LOCKS["cpu"]


def test_environment_is_the_lock():
    installed = installed_versions()
    lock = lock_for(installed)
    diffs = lock_differences(parse_lock(lock.read_text()), installed)
    assert not diffs, f"{sys.prefix} differs from {lock.name} in {len(diffs)} packages: {'; '.join(diffs)}. {FIX}"


def test_lock_differences_name_every_difference():
    lock = parse_lock("""# a made-up lock in uv's format
alpha==1.0 \\
    --hash=sha256:aa \\
    --hash=sha256:bb
    # via -r requirements.txt
beta==2.0.post1 \\
    --hash=sha256:cc
gamma==3.1+cpu \\
    --hash=sha256:dd
delta==4.0 ; sys_platform == 'win32' \\
    --hash=sha256:ee
epsilon==5.0
""")
    assert lock == {"alpha": ("1.0", None), "beta": ("2.0.post1", None), "gamma": ("3.1+cpu", None),
                    "delta": ("4.0", 'sys_platform == "win32"'), "epsilon": ("5.0", None)}
    linux = {"sys_platform": "linux"}
    same = {"Alpha": "1.0", "beta": "2.0.post1", "gamma": "3.1+cpu", "epsilon": "5.0", PROJECT: "0.1.0"}
    assert lock_differences(lock, same, linux) == []
    drifted = {"alpha": "1.0", "beta": "2.1", "gamma": "3.1", "zeta": "0.3", PROJECT: "0.1.0"}
    assert lock_differences(lock, drifted, linux) == [
        "beta: locked 2.0.post1, installed 2.1", "epsilon: locked 5.0, not installed",
        "gamma: locked 3.1+cpu, installed 3.1", "zeta: installed 0.3, not in the lock"]
    # delta is another platform's package: skipped where its marker is false, required where it is true
    assert lock_differences(lock, same, {"sys_platform": "win32"}) == ["delta: locked 4.0, not installed"]


def test_the_locks_agree_with_their_inputs_and_each_other():
    """requirements*.txt's pins and pyproject.toml's ranges hold in both locks (else `make lock` was not run after
    an edit); both locks pin the same versions outside torch's build; every entry carries hashes."""
    locks = {build: parse_lock(path.read_text()) for build, path in LOCKS.items()}
    wanted = []
    for name in ("requirements.txt", "requirements-dagster.txt"):
        wanted += [Requirement(line.split(" #")[0]) for line in (ROOT / name).read_text().splitlines()
                   if line.strip() and not line.startswith("#")]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted += [Requirement(r) for r in project["dependencies"]]
    wanted += [Requirement(r) for rs in project["optional-dependencies"].values() for r in rs]
    for build, pins in locks.items():
        bad = [f"{req} ({pins[canonicalize_name(req.name)][0] if canonicalize_name(req.name) in pins else 'not locked'})"
               for req in wanted if req.name != PROJECT and not (canonicalize_name(req.name) in pins and
               req.specifier.contains(pins[canonicalize_name(req.name)][0], prereleases=True))]
        assert not bad, f"{LOCKS[build].name} does not satisfy: {', '.join(bad)}; run `make lock`"
    assert Version(locks["cpu"]["torch"][0]).local == "cpu" and not Version(locks["cuda"]["torch"][0]).local
    shared = (set(locks["cpu"]) & set(locks["cuda"])) - {"torch"}
    assert {n: locks["cpu"][n] for n in shared} == {n: locks["cuda"][n] for n in shared}
    for path in LOCKS.values():
        entries = re.split(r"^(?=[^\s#-])", path.read_text(), flags=re.M)[1:]
        unhashed = [entry.split()[0] for entry in entries if "--hash=sha256:" not in entry]
        assert not unhashed, f"{path.name}: entries without hashes: {unhashed}"


def _imports(folder: Path) -> dict[str, str]:
    """{top-level module: first file importing it} of every absolute import in folder's .py files."""
    def statements(nodes):  # imports are statements: no need to walk every expression (ast.walk takes 4x longer)
        for node in nodes:
            yield node
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                if isinstance(getattr(node, field, None), list):
                    yield from statements(getattr(node, field))

    found: dict[str, str] = {}
    for path in sorted(folder.rglob("*.py")):
        for node in statements(ast.parse(path.read_text(), str(path)).body):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


def test_pyproject_declares_every_import():
    """Each third-party module imported by the code is provided by a distribution in pyproject's dependencies or its
    extras (test's only for tests/ and benchmarks/)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    runtime = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    runtime |= {canonicalize_name(Requirement(r).name) for name, rs in extras.items() if name != "test" for r in rs}
    everything = runtime | {canonicalize_name(Requirement(r).name) for r in extras["test"]}
    providers = metadata.packages_distributions()
    first_party = {"splavu_core", "assets", "pipeline"}
    undeclared = []
    for folders, declared in (((ROOT / "splavu_core", ROOT / "assets", ROOT / "pipeline"), runtime),
                              ((ROOT / "tests", ROOT / "benchmarks"), everything)):
        for folder in folders:
            local = {p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if p.is_dir()}
            for module, where in _imports(folder).items():
                if module in sys.stdlib_module_names or module in first_party or module in local:
                    continue
                dists = {canonicalize_name(d) for d in providers.get(module, [])}
                if not dists & declared:
                    undeclared.append(f"{module} ({where}; from {', '.join(sorted(dists)) or 'nothing installed'})")
    assert not undeclared, f"imported but not declared in pyproject.toml: {'; '.join(undeclared)}"
