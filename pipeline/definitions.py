"""The Dagster code location: `dagster dev -m pipeline.definitions`."""
import dagster as dg

from assets import aam, anonymized, baselines, catalog, evaluation, forget, latents, manifest, operating_point
from assets.groups import describe_groups
from assets.resources import EncoderResource, StoreResource, store_root_default
from pipeline import ablations
from pipeline.executors import splavu_executor
from pipeline.jobs import evaluate_job, extract_job, forget_job, pixel_baselines_job, train_aam_job
from pipeline.reanonymize import reanonymize_automation, reanonymize_job, reanonymize_schedule, refresh_catalog_job
from pipeline.sensors import inbox_sensor

# How `dagster dev` names this code location's repository: `<repository>@<location>`, the location being the module
# that workspace.yaml loads. The UI lists a job's runs by this run tag; the CLI's in-process runs carry it too.
REPOSITORY_LABEL = "__repository__@pipeline.definitions"
REPOSITORY_TAG = ".dagster/repository"

defs = dg.Definitions(
    assets=describe_groups([*dg.load_assets_from_modules([manifest, latents, aam, anonymized, catalog, evaluation,
                                                          baselines, operating_point, forget]), *ablations.ASSETS]),
    asset_checks=[*evaluation.CHECKS, *operating_point.CHECKS],  # load_assets_from_modules does not pick up checks
    jobs=[extract_job, train_aam_job, reanonymize_job, refresh_catalog_job, evaluate_job, ablations.ablations_job,
          pixel_baselines_job, operating_point.operating_point_job, forget_job],
    sensors=[inbox_sensor, reanonymize_automation],
    schedules=[reanonymize_schedule],
    # root stated, not left to the field's default: only then is it in the Launchpad's default run config, which
    # then shows which store a run writes to (tests/test_deploy.py)
    resources={"store": StoreResource(root=store_root_default()), "encoder": EncoderResource()},
    executor=splavu_executor,  # $SPLAVU_EXECUTOR: multiprocess (default), in_process, dask, k8s
)


def job_named(name: str) -> dg.JobDefinition:
    """Job `name` with the location's resources: how step processes, dask workers and pods rebuild a run's job
    (pipeline.executors.code_location_job)."""
    return defs.resolve_job_def(name)
