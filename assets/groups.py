"""One description per asset group: what the group holds and where it sits in the data flow.

Dagster has no description of its own for an asset group, so pipeline/definitions.py writes each group's into the
definition metadata of every asset in it (`group`): the UI shows it on each asset's page, and GraphQL serves it as
the assets' metadata entry (tests/test_ui_runs.py asks a running webserver for it). A group without a description
here fails the code location's load (describe_groups).
"""
import dagster as dg

METADATA_KEY = "group"

GROUPS = {
    "ingest": "1. Videos in: each registered dataset's manifest rows of a shard, validated; the private labels "
              "(attr_*, subject_id, group) split off into labels/, which no analyst view reads.",
    "latents": "2. Raw clip and static latents of each shard from the frozen video encoder (the only group that loads "
               "it): sensitive, kept in the store's locked-down part, never served to analysts.",
    "anonymizer": "3. The Anonymizing Adapter Module fitted from cached latents only (the encoder is never loaded): one "
                  "content-hashed version per fit, recorded in the version ledger, not current until published.",
    "publish": "4. What analysts read: each shard's anonymized table per AAM version, promoted to current only when "
               "every shard is published and both gates pass; the read-only DuckDB catalog and neighbour indexes.",
    "evaluation": "5. Raw and anonymized features scored per task by fresh readers and attackers on test splits, with "
                  "intervals: the privacy-utility report (the gates themselves are checks on anonymized_features).",
    "operating_point": "The keep family's curve on validation videos: which width k the two gates allow, beside the "
                       "width the current version publishes.",
    "baselines": "Pixel-space anonymizers (blur, blacken, 2x/4x downsampling) re-extracted through the same encoder into "
                 "stores of their own, scored beside splavu by the evaluation group.",
    "ablations": "The paper's ablation variants fitted and scored on the same cached latents, and their report.",
    "forget": "Forgetting videos or a subject (`splavu forget`, or the `forget` job from the UI): removed from every "
               "layer, checked, receipted; then the adapter refitted without them when it had been fitted on them.",
}


def describe_groups(assets: list) -> list:
    """`assets` with their group's description in each asset's definition metadata (METADATA_KEY). Raises
    ValueError naming a group that has no description."""
    def describe(spec: dg.AssetSpec) -> dg.AssetSpec:
        if spec.group_name not in GROUPS:
            raise ValueError(f"asset group {spec.group_name!r} ({spec.key.to_user_string()}) has no description in "
                             f"assets/groups.py")
        return spec.merge_attributes(metadata={METADATA_KEY: dg.MetadataValue.text(GROUPS[spec.group_name])})

    return [a.map_asset_specs(describe) if isinstance(a, dg.AssetsDefinition) else a for a in assets]
