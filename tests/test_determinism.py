"""The suite is deterministic: no test input comes from the OS's entropy or from a generator nobody seeded.

A lint over the test sources (AST, not text: comments and strings do not count) finds the calls that no seed can
fix - os.urandom, the secrets module, SystemRandom, and a generator built without a seed (default_rng(),
RandomState(), random.Random()). Calls on the global generators (np.random.rand, random.choice, torch.randn) are
seeded before every test by conftest's `seeded_global_generators`, which the last test checks. Unique names
(uuid4 for a scratch bucket prefix) are not test inputs and are allowed.
"""
import ast
import random
from pathlib import Path

import numpy as np
import torch

TESTS = Path(__file__).resolve().parent

ENTROPY = {("os", "urandom"), ("secrets", None), ("random", "SystemRandom")}
UNSEEDED_WHEN_NO_ARGUMENT = {"default_rng", "RandomState", "Random"}


def _dotted(node: ast.AST) -> list[str]:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return parts[::-1]


def nondeterministic_calls(source: str, filename: str = "<source>") -> list[str]:
    """'file:line: call' for each call in `source` that draws from the OS's entropy or builds an unseeded generator."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        if not name:
            continue
        hit = any(name[:1] == [mod] and (attr is None or name[1:2] == [attr]) for mod, attr in ENTROPY) \
            or name[-1] == "urandom"
        first = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "seed"), None)
        if name[-1] in UNSEEDED_WHEN_NO_ARGUMENT and (first is None or (isinstance(first, ast.Constant)
                                                                         and first.value is None)):
            hit = True
        if hit:
            out.append((node.lineno, f"{filename}:{node.lineno}: {'.'.join(name)}(...)"))
    return [text for _, text in sorted(out)]


def test_the_lint_finds_each_kind_of_unseeded_input():
    found = nondeterministic_calls(
        "import os, secrets, random\nimport numpy as np\n"
        "a = os.urandom(8)\nb = secrets.token_bytes(8)\nc = np.random.default_rng()\nd = np.random.RandomState(None)\n"
        "e = random.Random()\nf = random.SystemRandom().random()\ng = np.random.default_rng(seed=None)\n"
        "ok = np.random.default_rng(0).bytes(8), random.Random(3), np.random.RandomState(seed=1)  # os.urandom()\n")
    assert [f.split(":")[1] for f in found] == ["3", "4", "5", "6", "7", "8", "9"], found


def test_no_test_reads_entropy_or_an_unseeded_generator():
    found = [hit for path in sorted(TESTS.rglob("*.py"))
             for hit in nondeterministic_calls(path.read_text(), str(path.relative_to(TESTS)))]
    assert not found, "test inputs must be seeded (np.random.default_rng(N).bytes(n) for random bytes):\n" + "\n".join(found)


def test_global_generators_start_seeded_in_every_test():
    """conftest seeds numpy's, the stdlib's and torch's global generators before each test, so a test that draws from
    them gets the same numbers whatever ran before it in its worker."""
    assert torch.initial_seed() == 0
    expected = np.random.RandomState(0).get_state()
    assert all(np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
               for a, b in zip(np.random.get_state(), expected))
    assert random.getstate() == random.Random(0).getstate()


def _tad_videos(rng, n: int, split: str, dim: int = 48, T: int = 14) -> list:
    from splavu_core.tasks.features import VideoFeatures

    out = []
    for i in range(n):
        label = ("jump", "wave", "run")[i % 3]
        a = int(rng.integers(0, T - 5))
        feats = rng.normal(size=(T, dim)).astype(np.float32)
        feats[a:a + 4, i % 3] += 3.0
        out.append(VideoFeatures(f"{split}{i:03d}", split, feats, np.arange(T, dtype=float), np.arange(T) + 1.0,
                                 16 * T, 16.0, {"segments": [(float(a), float(a + 4), label)]}))
    return out


def test_the_tad_reader_gives_the_same_figures_on_any_core_count():
    """The report's TAD head trains on one intra-op thread whatever the process has: on two threads its
    convolutions' backward summed in another order and the demo's TAD mAP moved by up to a point per seed."""
    from splavu_core.evaluation.protocols import temporal_detection_head

    rng = np.random.default_rng(0)
    train, test = _tad_videos(rng, 90, "train"), _tad_videos(rng, 30, "test")
    before, maps = torch.get_num_threads(), []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            sc = temporal_detection_head(train, test, ["jump", "wave", "run"], seeds=[0, 1], epochs=60)
            maps.append([sc.metrics["mAP"](s, None) for s in range(2)])
            assert torch.get_num_threads() == n  # the process's own setting is left as it was
    finally:
        torch.set_num_threads(before)
    assert maps[0] == maps[1] and 0.0 < maps[0][0] <= 1.0
