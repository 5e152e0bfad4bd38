"""Dagster asset definitions, one module per stage; each is a thin layer over splavu_core."""
