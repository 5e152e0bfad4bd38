"""Dataset roles (splavu_core.ingest.datasets): registration, defaults from the demo's names, what training can use."""
import json
import shutil

import dagster as dg
import pytest

from assets.resources import StoreResource
from pipeline.sensors import inbox_sensor
from splavu_core.ingest.datasets import (
    RoleError,
    describe_registration,
    parse_roles,
    register_dataset,
    registered,
    task_datasets,
    training_plan,
)
from splavu_core.store.feature_store import FeatureStore


def test_roles_are_recorded_and_default_to_the_demo_names(tiny_bench, tmp_path):
    bench, _ = tiny_bench
    store = FeatureStore(tmp_path / "store")
    register_dataset(store, "ar", bench / "ar" / "manifest.csv")            # the demo's name: role ar
    register_dataset(store, "faces", bench / "privacy" / "manifest.csv", roles="privacy_evaluation")
    register_dataset(store, "walks", bench / "gait" / "manifest.csv")        # no roles: nothing reads it
    regs = {n: json.loads((tmp_path / "store" / "datasets" / f"{n}.json").read_text()) for n in ("ar", "faces", "walks")}
    assert (regs["ar"]["roles"], regs["ar"]["static_clips"]) == (["ar"], True)
    assert (regs["faces"]["roles"], regs["faces"]["static_clips"]) == (["privacy"], False)
    assert regs["walks"]["roles"] == []
    # the synthetic gait set carries attr_* labels (evaluation only), so privacy evaluation is suggested too
    assert describe_registration(regs["walks"]).startswith("roles: none, so no task reads it; its columns could "
                                                           "serve ar, gait, privacy: re-run with --roles ar,gait,privacy")
    found = task_datasets(store)
    assert found["ar"] == "ar" and found["privacy"] == "faces" and found["gait"] == "(no dataset with role gait)"
    register_dataset(store, "more_faces", bench / "privacy" / "manifest.csv", roles="privacy")
    with pytest.raises(RoleError, match=r"datasets \['faces', 'more_faces'\] all have role 'privacy'"):
        task_datasets(store)
    assert parse_roles("ar, action_recognition,bias") == ("ar", "bias_f")


def test_training_plan_uses_what_the_data_supports(tiny_bench, tmp_path):
    bench, _ = tiny_bench
    store = FeatureStore(tmp_path / "store")
    register_dataset(store, "clips", bench / "ar" / "manifest.csv", roles="ar")
    plan = training_plan(store)
    assert plan.tasks == ("ar",) and plan.datasets == {"ar": "clips", "tad": None, "ad": None}
    assert plan.selection == "val_ar" and set(plan.missing) == {"tad", "ad"}
    assert plan.summary().startswith("training on ar (clips); without tad, ad (no labelled data: no dataset has role tad")
    with pytest.raises(RoleError, match="task 'tad' has no labelled data .* --roles tad` .*needs segments.* --tasks ar$"):
        training_plan(store, ["ar", "tad"])
    register_dataset(store, "long", bench / "tad" / "manifest.csv", roles="tad")
    assert training_plan(store).tasks == ("ar", "tad")
    assert training_plan(store, ["tad"]).datasets == {"ar": "clips", "tad": "long", "ad": None}  # ar: val selection
    # tasks left out by --tasks are the user's choice, not a lack of data (it used to say "no labelled data")
    assert training_plan(store, "ar").summary() == "training on ar (clips); not on tad, ad (--tasks ar)"


def test_training_without_ar_selects_the_last_epoch(tiny_bench, tmp_path):
    bench, _ = tiny_bench
    store = FeatureStore(tmp_path / "store")
    register_dataset(store, "long", bench / "tad" / "manifest.csv", roles="tad")
    plan = training_plan(store)
    assert (plan.tasks, plan.selection, plan.datasets["ar"]) == (("tad",), "last", None)
    assert "model selection: last epoch" in plan.summary()
    with pytest.raises(RoleError, match="selection 'val_ar' needs a dataset with role ar"):
        training_plan(store, selection="val_ar")
    empty = FeatureStore(tmp_path / "empty")
    with pytest.raises(RoleError, match="nothing to train on"):
        training_plan(empty)


def test_inbox_folder_roles_file(tiny_bench, tmp_path):
    bench, _ = tiny_bench
    inst = dg.DagsterInstance.ephemeral()
    store = StoreResource(root=str(tmp_path / "store"), inbox=str(tmp_path / "inbox"))
    shutil.copytree(bench / "gait", tmp_path / "inbox" / "walks")
    (tmp_path / "inbox" / "walks" / "roles.txt").write_text("gait\n")
    result = inbox_sensor(dg.build_sensor_context(instance=inst, resources={"store": store}))
    assert [r.partition_key for r in result.run_requests] == ["inbox_walks-000"]
    assert registered(store.store())["inbox_walks"]["roles"] == ["gait"]
