"""splavu_core/settings.py is the one place a SPLAVU_* environment variable is read."""
import ast
import os
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from splavu_core import settings as st

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("splavu_core", "pipeline", "assets")
NAME = re.compile(r"SPLAVU_[A-Z0-9_]*[A-Z0-9]")


def sources() -> list[Path]:
    """The code and the configuration that ships with it (tests keep test-only variables of their own)."""
    out = [f for pkg in PACKAGES for f in (ROOT / pkg).rglob("*.py")]
    out += [ROOT / "Makefile", *ROOT.glob("*.yaml"), *(ROOT / "deploy").rglob("*.yaml")]
    return out


def test_every_splavu_name_in_the_source_is_a_settings_field():
    known = set(st.SETTINGS_FIELDS)
    stray = {f"{f.relative_to(ROOT)}: {m}" for f in sources() for m in NAME.findall(f.read_text())
             if m not in known}
    assert not stray, f"SPLAVU_* names that are no field of splavu_core.settings.Settings: {sorted(stray)}"


def _env_reads(tree: ast.AST):
    """(line, what) of every os.environ / os.getenv read whose key is a SPLAVU_ constant or an *_ENV name."""
    def suspicious(key) -> bool:
        return (isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.startswith("SPLAVU_")) \
            or (isinstance(key, ast.Name) and key.id.endswith("_ENV"))

    def is_environ(node) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ" or \
            isinstance(node, ast.Name) and node.id == "environ"

    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_environ(node.value) and suspicious(node.slice):
            yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.Call) and node.args and suspicious(node.args[0]):
            f = node.func
            if isinstance(f, ast.Attribute) and (f.attr == "getenv" or is_environ(f.value)):
                yield node.lineno, ast.unparse(node)


def test_the_reader_finds_a_direct_read():
    code = 'import os\nA = os.environ.get("SPLAVU_STORE")\nB = os.getenv(X_ENV)\nC = os.environ["SPLAVU_X"]\n'
    assert [line for line, _ in _env_reads(ast.parse(code))] == [2, 3, 4]


def test_no_module_but_settings_reads_a_splavu_variable():
    found = [f"{f.relative_to(ROOT)}:{line}: {what}" for pkg in PACKAGES for f in (ROOT / pkg).rglob("*.py")
             if f != ROOT / "splavu_core" / "settings.py" for line, what in _env_reads(ast.parse(f.read_text()))]
    assert not found, found


def test_every_field_is_documented_with_its_variable():
    for f in fields(st.Settings):
        assert f.metadata["env"] == st.PREFIX + f.name.upper(), f.name
        assert len(f.metadata["doc"]) > 20, f.name


def test_defaults_when_nothing_is_set():
    s = st.read_settings({})
    assert (s.store, s.privacy_budget, s.utility_gate, s.executor, s.lock_ttl_s, s.ann_min_rows) == \
        ("./store", st.DEFAULT_PRIVACY_BUDGET, st.DEFAULT_UTILITY_GATE, "multiprocess", 60.0, 10_000_000)
    assert dict(s.storage_options) == {} and s.reanonymize_cron == st.DEFAULT_CRON and s.aam_retention == 0
    assert st.read_settings({"SPLAVU_AAM_RETENTION": "", "SPLAVU_REANONYMIZE_CRON": ""}) == s  # empty: the default


def test_values_are_parsed():
    s = st.read_settings({"SPLAVU_PRIVACY_BUDGET": "-1", "SPLAVU_EXECUTOR": " In-Process ", "SPLAVU_LOG_LEVEL": "debug",
                          "SPLAVU_STORAGE_OPTIONS": '{"anon": true}', "SPLAVU_FORGET_CRASH_AFTER": "3"})
    assert (s.privacy_budget, s.executor, s.log_level, dict(s.storage_options), s.forget_crash_after) == \
        (-1.0, "in_process", "DEBUG", {"anon": True}, 3)
    s = st.read_settings({"SPLAVU_DECODE_WORKERS": "0", "SPLAVU_DECODER": " NVDEC "})
    assert (s.decode_workers, s.decoder) == (0, "nvdec")
    assert st.read_settings({}).decode_workers is None  # unset: the cores available (extract/shards.py)


@pytest.mark.parametrize("name,value", [("SPLAVU_PRIVACY_BUDGET", "half"), ("SPLAVU_UTILITY_GATE", "0,9"),
                                        ("SPLAVU_LOCK_TTL_S", "1m"), ("SPLAVU_ANN_MIN_ROWS", "1e7"),
                                        ("SPLAVU_AAM_RETENTION", "two"), ("SPLAVU_EXECUTOR", "celery"),
                                        ("SPLAVU_STORAGE_OPTIONS", "[1]"), ("SPLAVU_STORAGE_OPTIONS", "{nope"),
                                        ("SPLAVU_INSTALL_SECONDS", "soon"), ("SPLAVU_FORGET_CRASH_AFTER", "x"),
                                        ("SPLAVU_DECODE_WORKERS", "-1"), ("SPLAVU_DECODE_WORKERS", "all"),
                                        ("SPLAVU_DECODER", "ffmpeg")])
def test_a_bad_value_names_its_variable(name, value):
    with pytest.raises(st.SettingsError, match=name):
        st.read_settings({name: value})


def test_settings_follow_the_environment(monkeypatch):
    monkeypatch.setenv("SPLAVU_UTILITY_GATE", "0.25")
    assert st.settings().utility_gate == 0.25
    assert st.settings() is st.settings()  # parsed once for an unchanged environment
    monkeypatch.setenv("SPLAVU_UTILITY_GATE", "0.75")
    assert st.settings().utility_gate == 0.75
    monkeypatch.setenv("SPLAVU_UTILITY_GATE", "bad")
    with pytest.raises(st.SettingsError, match="SPLAVU_UTILITY_GATE"):
        st.settings()
    monkeypatch.delenv("SPLAVU_UTILITY_GATE")
    assert st.reload().utility_gate == st.DEFAULT_UTILITY_GATE


def test_no_variable_is_read_at_import_time():
    """Every library module imports under values that do not parse; only a call reads them."""
    bad = {name: "not-a-value" for name in st.SETTINGS_FIELDS}
    code = ("import splavu_core.store.feature_store, splavu_core.store.fs, splavu_core.store.ledger, splavu_core.serve.catalog, "
            "splavu_core.serve.neighbors, splavu_core.forget, pipeline.inprocess, pipeline.cli")
    env = {**os.environ, **bad, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
