"""Settings for runs launched in-process by the CLI (they still land in $DAGSTER_HOME's run history)."""
from splavu_core.settings import settings


def quiet(run_config: dict | None = None, level: str | None = None) -> dict:
    """Run config with Dagster's console logger at $SPLAVU_LOG_LEVEL (else `level`, default WARNING) so the CLI
    stays readable."""
    level = settings().log_level or (level or "WARNING").upper()
    return {**(run_config or {}), "loggers": {"console": {"config": {"log_level": level}}}}
