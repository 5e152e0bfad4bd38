"""Run the code location's named jobs against the local Dagster instance ($DAGSTER_HOME), as the CLI does.

Every command runs a job of pipeline.definitions by name (`extract_latents`, `train_aam`, `reanonymize`,
`refresh_catalog`, `evaluate`, `ablations`, `pixel_baselines`, `forget`, `choose_operating_point`) with its asset selection. The run
is created as the UI creates one, from the code location that workspace.yaml loads: it carries that location's
origin (`remote_job_origin`) and repository tag, so the UI's Overview timeline, the job's Runs tab and its
re-execution find it. It then executes in this process (the in-process executor, chosen in its run config): the
CLI sees what an asset raised, and needs no daemon or code server. The store and encoder reach the run through its
run config (resources.store.config.root, ...), as they would from the UI's Launchpad.

A workflow here takes the instance and the store first: `splavu` starts each by name through pipeline/cli.py's
`launch`, and the tests call them directly.
"""
from __future__ import annotations

import functools
import os
import shutil
import time
from pathlib import Path

import dagster as dg

from assets.anonymized import registered_shards, resolve_version
from assets.evaluation import EVAL_ASSETS, GATE_CHECKS, privacy_utility_report
from assets.partitions import shards
from assets.resources import EncoderResource, StoreResource
from pipeline.ablations import VARIANTS
from pipeline.definitions import REPOSITORY_LABEL, REPOSITORY_TAG, job_named
from pipeline.inprocess import quiet
from pipeline.launch import execute
from pipeline.reanonymize import anonymize_run_config
from pipeline.recovery import owned_run
from splavu_core import forget as fg
from splavu_core.ingest.datasets import register_dataset
from splavu_core.settings import settings
from splavu_core.store.feature_store import StoreError
from splavu_core.store.ledger import PublishError

PROJECT = Path(__file__).resolve().parents[1]  # the checkout (editable install) holding dagster.yaml and the Makefile
ANNOUNCED = ".splavu_announced"  # in an instance folder the CLI chose itself: its location was printed once
_CHOSEN: set[str] = set()  # the instance folders this process chose itself ($DAGSTER_HOME unset)


def instance() -> dg.DagsterInstance:
    """The Dagster instance every command records its runs in: $DAGSTER_HOME when set, else one folder the CLI
    chooses (instance_dir()), the same for every command and process, so `extract` in a new shell knows the shards
    `ingest` added and `dagster dev` pointed at that folder shows the CLI's runs."""
    if os.environ.get("DAGSTER_HOME"):
        os.makedirs(os.environ["DAGSTER_HOME"], exist_ok=True)
        return dg.DagsterInstance.get()
    home = str(instance_dir())
    _CHOSEN.add(home)
    return _instance_at(home)


def instance_dir() -> Path:
    """The instance folder when $DAGSTER_HOME is unset: $SPLAVU_DAGSTER_HOME, else the project checkout's
    .dagster_home (the one the Makefile exports), else $XDG_STATE_HOME/splavu/dagster_home."""
    if settings().dagster_home:
        return Path(settings().dagster_home).expanduser().resolve()
    if (PROJECT / "pyproject.toml").is_file() and (PROJECT / "dagster.yaml").is_file():
        return PROJECT / ".dagster_home"
    state = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(state) / "splavu" / "dagster_home"


@functools.cache
def _instance_at(home: str) -> dg.DagsterInstance:
    """One instance per folder for the whole process; the folder gets the project's dagster.yaml (the encoder pool,
    run monitoring) the first time, as `make setup` does for .dagster_home."""
    path = Path(home)
    path.mkdir(parents=True, exist_ok=True)
    cfg = path / "dagster.yaml"
    if not cfg.exists() and (PROJECT / "dagster.yaml").is_file():
        part = path / f".dagster.yaml.{os.getpid()}.part"
        shutil.copyfile(PROJECT / "dagster.yaml", part)
        os.replace(part, cfg)
    return dg.DagsterInstance.from_config(home)


def instance_note() -> str | None:
    """Once per instance folder the CLI chose itself (none while $DAGSTER_HOME is set): where the runs are and how the
    Dagster UI shows them. None when this process opened no such instance, or the folder was announced before."""
    for home in map(Path, sorted(_CHOSEN)):
        marker = home / ANNOUNCED
        if not marker.exists():
            marker.write_text("announced\n")
            return (f"note: Dagster runs are recorded in {home} ($DAGSTER_HOME is unset; every `splavu` command uses "
                    f"this folder). The UI shows them: DAGSTER_HOME={home} dagster dev")
    return None


def ingest(inst: dg.DagsterInstance, store: StoreResource, name: str, manifest: str, shard_size: int,
           roles=None, allow_forgotten: bool = False) -> list[str]:
    keys = register_dataset(store.store(), name, manifest, shard_size, roles=roles, allow_forgotten=allow_forgotten)
    _add_shards(inst, keys)
    return keys


def _add_shards(inst: dg.DagsterInstance, keys) -> None:
    have = set(inst.get_dynamic_partitions(shards.name))
    new = sorted(set(keys) - have)
    if new:
        inst.add_dynamic_partitions(shards.name, new)


def run_job(inst: dg.DagsterInstance, name: str, store: StoreResource, *, assets=None, partition_key: str | None = None,
            run_config: dict | None = None, resources: dict | None = None, tags: dict | None = None,
            raise_on_error: bool = True, skip_checks: tuple[str, ...] = (),
            log_level: str | None = None) -> dg.JobExecutionResult:
    """Run the code location's job `name` (assets: a subset of its selection, default all of it) as a run of that
    location, executed in this process; a run this process owns: a crash of an earlier one does not block it, and a
    wait on a pool slot is announced (pipeline/recovery.py). store / resources: their config goes into the run's
    config. skip_checks: asset checks (by name) left out of this run. log_level: the console's (default WARNING).
    The run carries the code location's origin and repository tag, as a run launched from the UI does."""
    job = job_named(name)
    keys = frozenset(dg.AssetKey(a) for a in assets) if assets else frozenset(job.asset_layer.executable_asset_keys)
    checks = frozenset(k for k in job.asset_layer.asset_graph.asset_check_keys
                       if k.asset_key in keys and k.name not in skip_checks)
    config = quiet({**(run_config or {}), "execution": {"config": {"in_process": {}}},
                    "resources": {n: {"config": resource_config(r)} for n, r in {"store": store, **(resources or {})}.items()}},
                   log_level)
    with owned_run(inst, store.root) as owner:
        tags = {REPOSITORY_TAG: REPOSITORY_LABEL, "splavu/entry": "cli", **owner, **(tags or {}),
                **({"dagster/partition": partition_key} if partition_key else {})}
        return execute(inst, name, config, tags, keys, checks, raise_on_error)


def resource_config(resource: dg.ConfigurableResource) -> dict:
    """A resource's fields as run config (resources.<name>.config), unset optional ones left out."""
    return {k: getattr(resource, k) for k in type(resource).model_fields if getattr(resource, k) is not None}


def metadata(res: dg.JobExecutionResult, node: str) -> dict:
    """The values of the metadata of `node`'s first materialization in a run."""
    return {k: v.value for k, v in res.asset_materializations_for_node(node)[0].metadata.items()}


def materialize_shard(inst, shard: str, store: StoreResource, encoder: EncoderResource,
                      selection=("video_manifest", "clip_latents", "static_latents")) -> dg.JobExecutionResult:
    # the store's registration is the truth: an instance that never saw this shard's `ingest` (another
    # $DAGSTER_HOME, a wiped one) learns the partition here instead of failing with DagsterUnknownPartitionError
    _add_shards(inst, [shard])
    return run_job(inst, "extract_latents", store, assets=selection, partition_key=shard, resources={"encoder": encoder})


def extract_shards(inst, store: StoreResource, shards, encoder: EncoderResource):
    """Each shard's extract_latents run in turn, yielding its row as it finishes: videos, clips, static clips,
    quarantined, clips/s (every clip encoded, static ones included) and skipped (extracted before)."""
    for shard in shards:
        res = materialize_shard(inst, shard, store, encoder)
        md = {m.asset_key.to_user_string(): m.metadata for m in res.asset_materializations_for_node("extracted_latents")}
        clip, static = md["clip_latents"], md["static_latents"]
        yield {"shard": shard, "videos": clip["videos"].value, "clips": clip["clips"].value,
               "static_clips": static["static_clips"].value if "static_clips" in static else 0,
               "quarantined": clip["quarantined"].value, "clips_per_s": clip["clips_per_s"].value,
               "skipped": clip["skipped"].value}


def train_aam(inst, store: StoreResource, config: dict | None = None) -> dict:
    """The `train_aam` job; returns aam_model's metadata values (its `version` among them)."""
    res = run_job(inst, "train_aam", store, run_config={"ops": {"aam_model": {"config": dict(config or {})}}})
    return metadata(res, "aam_model")


def run_curve(inst, store: StoreResource, config: dict | None = None) -> tuple[dict, list[dict]]:
    """The `choose_operating_point` job: the operating_point asset's metadata values and its checks' verdicts
    ({name, passed, description})."""
    res = run_job(inst, "choose_operating_point", store,
                  run_config={"ops": {"operating_point": {"config": dict(config or {})}}})
    return metadata(res, "operating_point"), [{"name": c.check_name, "passed": c.passed, "description": c.description}
                                              for c in res.get_asset_check_evaluations()]


def run_reanonymize(inst: dg.DagsterInstance, store: StoreResource, version: str = "",
                    shard_keys: list[str] | None = None, retention: int = 0, catalog: bool = True,
                    gates: bool | None = None) -> dict:
    """Publish `shard_keys` (default: every registered shard with latents) with `version` (default newest),
    one `reanonymize` run per shard as the job does, then `refresh_catalog`. Raises on the first failing shard.
    gates: run the blocking gate checks (privacy_budget, utility_budget) in every shard's run (True), in the last
    one only (None, default: by then the version is complete), or never (False). out["checks"] holds their verdicts."""
    feature_store = store.store()
    version = resolve_version(feature_store, version)
    keys = shard_keys if shard_keys is not None else [s for s in registered_shards(feature_store) if feature_store.committed(s)]
    _add_shards(inst, keys)
    out = {"version": version, "shards": {}}
    gate_names = tuple(k.name for c in GATE_CHECKS for k in c.check_keys)
    tags = {"splavu/trigger": "cli", "splavu/aam_version": version}
    for i, key in enumerate(keys):
        # the two blocking gates run as real asset checks in the shard's run (cached per version: measured once);
        # a failed gate fails the run's check (red in the UI) but is a verdict, not an error of the shard
        with_gates = gates or (gates is None and i == len(keys) - 1)
        t0 = time.perf_counter()
        res = run_job(inst, "reanonymize", store, assets=["anonymized_features"], partition_key=key,
                      run_config=anonymize_run_config(version, retention), tags=tags, raise_on_error=False,
                      skip_checks=() if with_gates else gate_names,
                      log_level="CRITICAL" if with_gates else None)  # a refused gate is printed by the CLI
        if not res.asset_materializations_for_node("anonymized_features"):
            # the shard itself failed: run it alone so that what the asset raised reaches the caller
            run_job(inst, "reanonymize", store, assets=["anonymized_features"], partition_key=key,
                    run_config=anonymize_run_config(version, retention), tags=tags, skip_checks=gate_names)
            raise PublishError(f"publishing shard {key} with AAM {version} failed")
        out["shards"][key] = metadata(res, "anonymized_features")
        out.setdefault("run_seconds", {})[key] = {"seconds": time.perf_counter() - t0, "gates": bool(with_gates)}
        for ev in res.get_asset_check_evaluations():
            out.setdefault("checks", {})[ev.check_name] = {"passed": ev.passed, "description": ev.description}
    if catalog:
        res = run_job(inst, "refresh_catalog", store, tags={"splavu/trigger": "cli"})
        out["catalog"] = metadata(res, "feature_catalog")
    return out


def run_forget(inst: dg.DagsterInstance, store: StoreResource, request_id: str) -> dict:
    """The `forget` job on one journaled request (erase, then the refit it calls for). Returns {asset: its metadata
    values} for what the run materialized: forget_request, forget_refit, and what the refit reported as aam_model,
    feature_catalog and anonymized_features ({shard: values}); plus "error": (expected, one line) when it failed
    (expected: an error of the request or the store, which the asset reported as a Failure; else a bug)."""
    res = run_job(inst, "forget", store, run_config={"ops": {"forget_videos": {"config": {"request_id": request_id}}}},
                  raise_on_error=False)
    out: dict = {}
    for m in res.asset_materializations_for_node("forget_videos"):
        values = {k: v.value for k, v in m.metadata.items()}
        if m.partition:
            out.setdefault(m.asset_key.to_user_string(), {})[m.partition] = values
        else:
            out[m.asset_key.to_user_string()] = values
    if not res.success:
        out["error"] = run_failure(res)
    return out


def forget(inst: dg.DagsterInstance, store: StoreResource, videos=(), subjects=(), ids_file: str | None = None,
           reason: str = "", policy: str | None = None):
    """`splavu forget`: the requests an earlier run left unfinished, then one for `videos` (and those `ids_file`
    lists) and `subjects`, each run by the `forget` job (run_forget). Yields what happens, in order: ("request", id,
    note) before a run and ("ran", run_forget's values) after it; before the new request, ("already", video id) for
    each video erased before, ("erasing", targets, the user's files, their manifests) and ("policy", policy); or
    ("nothing else",) when the request was the unfinished one. A failed run raises its error after its "ran"."""
    if not reason.strip():
        raise fg.ForgetError("--reason TEXT is required (why; kept in the erasure log, so do not name the person)")
    named = list(videos) + (fg.read_ids_file(ids_file) if ids_file else [])
    if not (named or subjects):
        raise fg.ForgetError("name what to erase: --video ID ..., --subject ID ... or --file F (one video id a line)")
    feature_store = store.store()
    finished = []
    for rid in fg.pending_requests(feature_store):
        yield from _forget_request(inst, store, rid, note="left unfinished by an earlier run")
        finished.append(rid)
    try:
        targets, already = fg.resolve(feature_store, named, subjects)
    except fg.ForgetError:
        if finished:  # the request repeated was the unfinished one: nothing is left of it
            yield ("nothing else",)
            return
        raise
    yield from (("already", v) for v in already)
    if not targets:
        return
    yield ("erasing", targets, *fg.own_files(feature_store, targets))
    scope = ", ".join(x for x, given in (("video", videos), ("subject", subjects), ("file", ids_file)) if given)
    journal = fg.open_request(feature_store, targets, reason, subjects=list(subjects), policy=policy, scope=scope)
    yield ("policy", journal["policy"])
    yield from _forget_request(inst, store, journal["request_id"])


def _forget_request(inst, store: StoreResource, request_id: str, note: str = ""):
    yield ("request", request_id, note)
    out = run_forget(inst, store, request_id)
    yield ("ran", out)
    if "error" in out:
        expected, message = out["error"]
        raise (StoreError if expected else RuntimeError)(message)


def run_failure(res: dg.JobExecutionResult) -> tuple[bool, str]:
    """(expected, one line) of a failed run: a dg.Failure's description (expected), else what was raised first."""
    for ev in res.get_step_failure_events():
        data = ev.step_failure_data
        if data.user_failure_data is not None and data.user_failure_data.description:
            return True, data.user_failure_data.description
        err = data.error
        while err is not None and err.cause is not None:
            err = err.cause
        if err is not None:
            return False, f"{err.cls_name}: {err.message.strip().splitlines()[0] if err.message.strip() else ''}"
    return False, f"run {res.run_id} failed"


def run_evaluation(inst: dg.DagsterInstance, store: StoreResource, config: dict | None = None,
                   raise_on_error: bool = True) -> dg.JobExecutionResult:
    """The `evaluate` job in-process: every *_eval asset, privacy_utility_report and its utility_retention check.
    config: EvalConfig fields applied to every eval asset (e.g. {"aam_version": ...}). The report is then at
    <root>/reports/privacy_utility.{json,md,png}."""
    ops = {a.node_def.name: {"config": dict(config or {})} for a in EVAL_ASSETS}
    rep = {k: config[k] for k in ("aam_version", "seed", "n_seeds") if config and config.get(k)}
    if rep:
        ops[privacy_utility_report.node_def.name] = {"config": rep}
    return run_job(inst, "evaluate", store, run_config={"ops": ops}, raise_on_error=raise_on_error)


def run_ablations(inst: dg.DagsterInstance, store: StoreResource, variants=None, epochs: int | None = None,
                  config: dict | None = None, log=print) -> dict:
    """The `ablations` job in-process: one run per variant (default: all), then the report; returns the report dict.

    epochs: AAM training epochs (default: the base config's). config: further AblationConfig fields (e.g. smaller
    probes or adapter)."""
    cfg = {**(config or {}), **({"epochs": int(epochs)} if epochs else {})}
    names = list(variants or VARIANTS)
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown ablation variant(s) {unknown}; choose from {list(VARIANTS)}")
    for v in names:
        t0 = time.perf_counter()
        res = run_job(inst, "ablations", store, assets=["ablation_variant"], partition_key=v,
                      run_config={"ops": {"ablation_variant": {"config": cfg}}})
        assert res.success, f"ablation variant {v} failed"
        if log:
            log(f"  {v:12s} done in {time.perf_counter() - t0:.0f} s")
    res = run_job(inst, "ablations", store, assets=["ablation_report"], partition_key=names[-1],
                  run_config={"ops": {"ablation_report": {"config": cfg}}})
    assert res.success, "ablation_report failed"
    return store.store().files.read_json("reports/ablations.json")


def run_baselines(inst, store: StoreResource, encoder: EncoderResource, names, mask_source: str = "none",
                  datasets=(), log=print) -> dict[str, dict]:
    """The `pixel_baselines` job for each baseline in `names`; returns name -> its metadata."""
    out = {}
    for name in names:
        cfg = {"mask_source": mask_source, "datasets": list(datasets)}
        res = run_job(inst, "pixel_baselines", store, partition_key=name, resources={"encoder": encoder},
                      run_config={"ops": {"pixel_baseline_latents": {"config": cfg}}})
        md = metadata(res, "pixel_baseline_latents")
        out[name] = md
        if log:
            log(f"  pixel_{name:8s} skipped: {md['reason']}" if md["skipped"] else
                f"  pixel_{name:8s} {md['shards_extracted']} shards extracted ({md['shards_skipped']} already done), "
                f"{md['clips']} clips in {md['seconds']:.0f} s")
    return out
