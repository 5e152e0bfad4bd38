"""One run of a pipeline.definitions job in a process of its own (used by tests/test_cluster.py).

Why a process: Dagster is not thread-safe. Every run start builds a log manager, and with an instance
that has settings that calls `logging.config.dictConfig`, which closes every live handler under the
logging module's lock; a run in another thread of the same process, inside its DagsterLogHandler (holding
that handler's lock) and logging through SQLAlchemy (wanting the module lock), then deadlocks with it.
Two runs in two threads of the test process hung `make test` about one time in three. As the CLI, the
daemon and the run launchers do, each run here has its interpreter to itself.

argv[1]: a JSON object {instance_ref, job, run_config, tags} (instance_ref serialised by dagster's serdes);
stdout, last line: {run_id, success, failures, pids}. SIGUSR1 dumps every thread's stack to stderr, so
the parent can say where a run that does not end is stuck before it kills it.
"""
import faulthandler
import json
import signal
import sys

import dagster as dg
from dagster import deserialize_value

from pipeline.executors import code_location_job


def main() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    args = json.loads(sys.argv[1])
    instance = dg.DagsterInstance.from_ref(deserialize_value(args["instance_ref"]))
    with instance, dg.execute_job(code_location_job(args["job"]), instance, run_config=args["run_config"],
                                  tags=args["tags"]) as res:
        out = {"run_id": res.run_id, "success": res.success,
               "failures": [e.message for e in res.all_events if e.is_failure],
               "pids": {e.step_key: e.pid for e in res.all_events
                        if e.event_type == dg.DagsterEventType.STEP_SUCCESS}}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
