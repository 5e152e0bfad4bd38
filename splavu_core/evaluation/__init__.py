"""Stage 6, judging a version: attackers, readers, protocols with intervals, the promotion gates and the report.

Metrics on plain arrays live in `splavu_core.tasks.metrics`; import what you need from its module."""
