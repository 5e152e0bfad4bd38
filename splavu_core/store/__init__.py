"""The store every stage stands on: where bytes live (fs), the raw latents and tables (feature_store), AAM versions
(ledger, the only version API), what was forgotten (forget_records) and what each step cost (costs)."""
