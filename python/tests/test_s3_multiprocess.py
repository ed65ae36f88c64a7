"""Multi-process jobs saving to and loading from s3:// (a real server, see
s3_server.py): each process writes its own shards, and a job of another
shape loads them."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).with_name("multiprocess")))
import harness  # noqa: E402


def test_a_4_process_save_loads_on_2_processes(s3):
    url = s3.url("mp/ckpt")
    results = harness.run_job(4, 2, "s3_scenarios:save_and_verify", {"path": url})
    # 6 jax.Array leaves checked on 2 devices per process; 9 leaves in all.
    assert [r["process"] for r in results] == [0, 1, 2, 3]
    assert all(r["checked"] == 12 and r["leaves"] == 9 for r in results), results
    index_files = [k for k in s3.keys("mp/ckpt/") if k.endswith(".idx")]
    assert len(index_files) == 4, index_files  # one per process
    results = harness.run_job(2, 4, "load_state",
                              {"path": url, "mesh_shape": [2, 4], "untargeted": True})
    assert [r["checked"] for r in results] == [6 * 4] * 2
    assert all(r["global"] for r in results)


def test_a_2_process_job_saves_checkpointables_and_loads_parts(s3):
    results = harness.run_job(2, 2, "checkpointables", {"path": s3.url("mp2/ckpt")})
    for r in results:
        assert r["step"] == 3
        assert r["checkpointables"] == ["blob", "config", "state"]
        assert r["checked"] == 2 + 3 * 2
