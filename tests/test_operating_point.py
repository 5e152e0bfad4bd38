"""The publish rule (splavu_core/evaluation/operating_point.py): the candidate it picks from selection figures, the
lazy scoring that must pick what full scoring picks, the family's configurations, and the rule on a real store."""
import json
import shutil

import numpy as np
import pytest

from splavu_core.aam.config import TrainConfig
from splavu_core.evaluation import operating_point as op

BUDGET, FLOOR = 0.5, 0.95


def member(name, closeups, ar, clips=(0.9, 0.8, 1.0), linkage=(1.0, 0.95, 1.05)):
    return {"name": name, "changes": {}, "figures": {"privacy": list(closeups), "clip_privacy": list(clips),
                                                     "reid": list(linkage), "ar": list(ar)},
            "units": {}, "scored": ["privacy", "clip_privacy", "reid", "ar"]}


def test_the_rule_picks_the_most_private_candidate_predicted_to_pass_both_gates():
    members = [member("useful", (0.60, 0.57, 0.63), (1.02, 0.99, 1.05)),   # safe, less private
               member("private", (0.72, 0.69, 0.75), (1.01, 0.98, 1.04)),  # safe, more private: picked
               member("lossy", (0.80, 0.77, 0.83), (0.93, 0.90, 0.96))]    # most private, loses AR: not safe
    choice = op.pick(members, ["ar"], BUDGET, FLOOR)
    assert choice["chosen"] == "private" and set(choice["safe"]) == {"useful", "private"} and not choice["limits"]
    assert members[2]["assessment"]["weakest"] == "AR" and members[2]["assessment"]["z_min"] < op.Z_SAFE


def test_without_a_safe_candidate_the_rule_picks_the_most_likely_to_publish_and_says_so():
    members = [member("thin", (0.56, 0.51, 0.61), (1.0, 0.95, 1.05)),    # privacy: lower end at the bar
               member("lossy", (0.75, 0.70, 0.80), (0.94, 0.89, 0.99))]  # AR below the floor
    choice = op.pick(members, ["ar"], BUDGET, FLOOR)
    assert not choice["safe"] and choice["chosen"] == "thin" and "no candidate is predicted" in choice["why"]
    # what holds the family back: AR is cleared by one candidate, but not with confidence (more data would decide)
    (line,) = choice["limits"]
    assert line.startswith("no candidate clears AR (best: thin, 1.000") and line.endswith("would decide it")
    # a part's z: its estimate's distance past the gate's bar, in the two splits' noise
    z = members[0]["assessment"]["z"]
    half = 0.05
    assert z["privacy"] == pytest.approx((0.56 - BUDGET - half) / (np.hypot(half, half) / 1.959964), abs=1e-3)
    assert z["ar"] == pytest.approx((1.0 - FLOOR) / (np.hypot(half, half) / 1.959964), abs=1e-3)


def test_a_larger_validation_split_lowers_the_bar_the_rule_predicts():
    m = member("m", (0.58, 0.53, 0.63), (1.0, 0.95, 1.05))
    m["units"] = {"privacy": 100}
    same = op.assess(m, ["ar"], BUDGET, FLOOR, {"privacy": 100})["z"]["privacy"]
    larger = op.assess(m, ["ar"], BUDGET, FLOOR, {"privacy": 400})["z"]["privacy"]  # validation's interval half as wide
    assert larger == pytest.approx((0.58 - BUDGET - 0.025) / (np.hypot(0.05, 0.025) / 1.959964), abs=1e-3)
    assert larger > same == op.assess(m, ["ar"], BUDGET, FLOOR)["z"]["privacy"]  # unknown: taken as selection's


def test_a_candidate_without_closeups_is_never_safe():
    m = member("m", (0.9, 0.85, 0.95), (1.0, 0.98, 1.02))
    del m["figures"]["privacy"]
    a = op.assess(m, ["ar"], BUDGET, FLOOR)
    assert a["z_min"] == -np.inf and a["p_publish"] == 0.0


class _Table:
    """A Measured stand-in whose parts come from a hidden table of figures: what pick_lazily may ask for."""

    def __init__(self, full: list[dict]):
        self.full = {m["name"]: m for m in full}
        self.which = ["privacy", "clip_privacy", "reid", "ar", "tad"]
        self.members = [{"name": m["name"], "changes": {}, "figures": {}, "units": {}, "scored": []} for m in full]
        self.asked = []

    def score(self, names, tasks):
        for m in self.members:
            if m["name"] in names:
                for t in tasks:
                    if t in self.full[m["name"]]["figures"]:
                        m["figures"][t] = list(self.full[m["name"]]["figures"][t])
                    m["scored"].append(t)
                    self.asked.append((m["name"], t))


def test_lazy_scoring_picks_what_scoring_every_part_picks():
    rng = np.random.default_rng(0)
    saved = 0
    for trial in range(300):
        full = []
        for i in range(int(rng.integers(2, 7))):
            figs = {}
            for t, centre in (("privacy", 0.62), ("clip_privacy", 0.8), ("reid", 0.9), ("ar", 0.97), ("tad", 1.1)):
                v, h = centre + rng.normal(0, 0.08), abs(rng.normal(0.05, 0.02)) + 1e-3
                figs[t] = [v, v - h, v + h]
            full.append({"name": f"c{i}", "figures": figs})
        want = op.pick([{**m, "units": {}} for m in json.loads(json.dumps(full))], ["ar", "tad"], BUDGET, FLOOR)
        table = _Table(full)
        got = op.pick_lazily(table, ["ar", "tad"], BUDGET, FLOOR)
        assert got["chosen"] == want["chosen"], trial
        saved += len(full) * len(table.which) - len(table.asked)
    assert saved > 0  # and it scored less


def test_the_family_changes_only_what_each_candidate_names():
    base = TrainConfig().replace(seed=3, keep_ridge=0.2)
    fam = {c.name: c for c in op.family(base)}
    assert list(fam) == list(op.CANDIDATES)
    assert fam["default"].config == base
    for c in fam.values():
        assert c.config.seed == 3 and c.config.keep_ridge == 0.2 and c.config.operating_point == "rule"
        for k, v in c.changes.items():
            assert (c.config.flat()[k] if k in base.flat() else c.config.adapter[k]) == v, (c.name, k)
    with pytest.raises(ValueError, match="unknown candidate"):
        op.family(base, ["nope"])


@pytest.fixture(scope="module")
def store_copy(tiny_store, tmp_path_factory):
    root = tmp_path_factory.mktemp("rule") / "store"
    shutil.copytree(tiny_store, root)
    return root


def test_the_rule_on_a_store_scores_the_selection_split_and_records_its_pick(store_copy):
    from splavu_core.aam.training_data import load_training_data
    from splavu_core.evaluation.scoring import task_split
    from splavu_core.evaluation.suite import load_feature_sets
    from splavu_core.store.feature_store import FeatureStore

    store = FeatureStore(store_copy)
    data = load_training_data(store, tad=None, ad=None)
    cfg = TrainConfig().replace(tasks=("ar",), diagnose_steps=20)
    chosen_cfg, record = op.choose(store, data, cfg, seeds=range(2))
    names = [m["name"] for m in record["members"]]
    assert names == list(op.CANDIDATES) and record["chosen"] in names and record["split"] == "select"
    chosen = next(c for c in op.family(cfg) if c.name == record["chosen"])
    assert chosen_cfg == chosen.config and record["request"] == cfg.flat()
    # every candidate was scored on the parts scored first; the pick on every part the store can measure
    pick = next(m for m in record["members"] if m["name"] == record["chosen"])
    assert all(set(op.FIRST) <= set(m["scored"]) for m in record["members"])
    assert set(pick["scored"]) == {"privacy", "clip_privacy", "reid", "ar"}
    assert json.loads(store.files.read_bytes("reports/operating_point.json")) == json.loads(json.dumps(record))
    assert store.files.read_bytes("reports/operating_point.png")[:4] == b"\x89PNG"
    # the selection split: the tiny world has none of its own, so it is carved from train, whole people, apart from
    # the validation videos the gates read and from the test videos the report reads
    privacy = load_feature_sets(store, ["privacy", "ar"], "raw")
    for ds, task in (("privacy", "privacy"), ("ar", "ar")):
        _, sel = task_split(privacy[ds], "select", task)
        probe, val = task_split(privacy[ds], "val", task)
        assert sel and val and {v.split for v in sel} == {"train"}
        assert not {v.video_id for v in sel} & ({v.video_id for v in val} | {v.video_id for v in probe})
        people = lambda vs: {v.meta.get("subject_id") or v.video_id for v in vs}  # noqa: E731
        assert not people(sel) & people(val)
        assert task in pick["scored"] and pick["units"].get(task, len(sel)) == len(sel)  # (AR at chance: no figure)
    assert pick["units"]["privacy"] > 0


def test_the_operating_point_job_says_what_the_rule_picks_and_whether_the_current_version_is_it(store_copy):
    """`splavu curve` runs the job choose_operating_point: the rule without fitting a version, and its WARN check."""
    import dagster as dg

    from assets.operating_point import current_is_the_rules_pick, operating_point
    from assets.resources import StoreResource

    res = dg.materialize([operating_point, current_is_the_rules_pick],
                         resources={"store": StoreResource(root=str(store_copy))},
                         run_config={"ops": {"operating_point": {"config": {"tasks": ["ar"], "diagnose_steps": 20}}}})
    md = {k: v.value for k, v in res.asset_materializations_for_node("operating_point")[0].metadata.items()}
    record = json.loads((store_copy / "reports" / "operating_point.json").read_text())
    assert md["operating_point"] == record["chosen"] in op.CANDIDATES and md["operating_point_why"] == record["why"]
    assert "(picked)" in md["operating_point_candidates"] and "data:image/png;base64," in md["operating_point_curve"]
    check, = res.get_asset_check_evaluations()
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN and "no version is current" in \
        check.description
