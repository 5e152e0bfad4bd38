"""erasure_request: complete one journaled erasure request (`splavu forget` opens it; splavu_core/forget.py works)."""
import dagster as dg
from pydantic import Field

from assets.resources import StoreResource
from splavu_core.forget import check_line, layer_totals, run_request


class ForgetConfig(dg.Config):
    # only the request's id: the videos are named in the store's journal, never in run config (kept by Dagster)
    request_id: str = Field(description="the erasure request to complete (opened by `splavu forget`)")


@dg.asset(group_name="erasure", kinds={"zarr", "parquet"},
          description="Removes the videos of one erasure request from every layer of the store (raw latents, "
                      "anonymized tables, manifests, labels, caches, neighbour indexes, catalog), retires the AAM "
                      "versions fitted on them, reads every file back to check, and appends the receipt to the "
                      "erasure log. A killed run is completed by running it again.")
def erasure_request(context: dg.AssetExecutionContext, config: ForgetConfig, store: StoreResource) -> dg.MaterializeResult:
    summary = run_request(store.store(), config.request_id, log=context.log.warning)
    if not summary["check"]["clean"]:
        raise dg.Failure(description=f"erasure request {config.request_id}: {check_line(summary['check'])}")
    return dg.MaterializeResult(metadata={
        "request_id": config.request_id, "videos": summary["videos"], "check": check_line(summary["check"]),
        "layers": dg.MetadataValue.json(layer_totals(summary["receipt"])),
        "summary": dg.MetadataValue.json({k: summary[k] for k in ("refit_config", "current_before", "fitted_versions",
                                                                   "keep_fitted")})})
