"""The Dagster code location: `dagster dev -m pipeline.definitions`."""
import dagster as dg

from assets import latents, manifest
from pipeline.jobs import extract_job
from pipeline.resources import EncoderResource, StoreResource
from pipeline.sensors import inbox_sensor

defs = dg.Definitions(
    assets=dg.load_assets_from_modules([manifest, latents]),
    jobs=[extract_job],
    sensors=[inbox_sensor],
    resources={"store": StoreResource(), "encoder": EncoderResource()},
)
