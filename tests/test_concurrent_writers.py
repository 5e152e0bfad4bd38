"""Two processes writing one shard of a local store, with no shared Dagster instance (issue 13, item 5)."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa

from splavu_core.store.feature_store import (
    CLIP_INDEX_SCHEMA,
    QUARANTINE_SCHEMA,
    STATIC_INDEX_SCHEMA,
    FeatureStore,
    ShardLatents,
)

REPO = Path(__file__).resolve().parents[1]

WRITER = textwrap.dedent("""
    import sys
    from test_concurrent_writers import generation
    from splavu_core.store.feature_store import FeatureStore
    store, n = FeatureStore(sys.argv[1]), int(sys.argv[2])
    for i in range(n):  # every commit replaces the shard: the other writer's staging must survive it
        store.write_shard("ar-000", generation(int(sys.argv[3]) + i), {"encoder_fingerprint": "fp"}, f"h{i}")
""")

PRODUCER = textwrap.dedent("""
    import os, sys, time
    from test_concurrent_writers import generation
    from splavu_core.store.feature_store import FeatureStore
    store, log = FeatureStore(sys.argv[1]), sys.argv[2]
    def extract():  # the expensive part: it must run once for both processes
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(1.0)
        return generation(7)
    marker, skipped = store.produce_shard("ar-000", {"encoder_fingerprint": "fp"}, "h", extract)
    print("skipped" if skipped else "extracted", marker["clips"])
""")


def generation(g: int, n: int = 6, d: int = 4) -> ShardLatents:
    """Shard data whose every latent is g (cheap to import in a subprocess: no Dagster, no torch)."""
    index = pa.table({"video_id": [f"v{i}" for i in range(n)], "clip_index": pa.array([0] * n, pa.int32()),
                      "start_frame": pa.array([0] * n, pa.int32()), "end_frame": pa.array([16] * n, pa.int32()),
                      "start_s": [0.0] * n, "end_s": [1.0] * n, "split": ["train"] * n}, schema=CLIP_INDEX_SCHEMA)
    return ShardLatents(clips=np.full((n, d), g, np.float32), index=index, static=np.zeros((0, 2, d), np.float32),
                        static_index=STATIC_INDEX_SCHEMA.empty_table(), quarantine=QUARANTINE_SCHEMA.empty_table())


def spawn(script, *argv):
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}
    return subprocess.Popen([sys.executable, "-c", script, *map(str, argv)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_writers_of_one_shard_never_break_each_other(tmp_path):
    procs = [spawn(WRITER, tmp_path, 20, g) for g in (100, 200)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
    store = FeatureStore(tmp_path)
    data = store.read_shard("ar-000")
    assert np.unique(data.clips).size == 1 and int(data.clips[0, 0]) in (119, 219)  # one whole generation: a last one
    assert list((tmp_path / "latents" / ".staging").iterdir()) == []


def test_a_second_producer_of_a_shard_waits_and_skips_the_work(tmp_path):
    log = tmp_path / "extractions.log"
    procs = [spawn(PRODUCER, tmp_path, log) for _ in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        outs.append(out.split()[0])
    assert sorted(outs) == ["extracted", "skipped"]
    assert len(log.read_text().splitlines()) == 1  # the encoder ran once
