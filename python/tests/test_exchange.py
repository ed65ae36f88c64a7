"""exchange_bytes: bytes between processes through JAX collectives."""

import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).with_name("multiprocess")))
import harness  # noqa: E402

from shardkeep.job import exchange  # noqa: E402
from shardkeep.errors import InvalidArgumentError  # noqa: E402


def test_patterns_in_a_four_process_job():
    results = harness.run_job(4, 1, "exchange_scenarios:patterns", timeout=180)
    assert all("not a process index of this 4-process job" in r["bad_destination"]
               for r in results)


def test_a_single_process_job_keeps_its_own_buffers():
    data = np.arange(10, dtype=np.float32)
    got = exchange.exchange_bytes({0: [data]}, name="own")
    assert list(got) == [0]
    assert np.array_equal(got[0][0].view(np.float32), data)
    assert exchange.exchange_bytes({}, name="empty") == {}
    with pytest.raises(InvalidArgumentError, match="destination 1"):
        exchange.exchange_bytes({1: [data]}, name="bad")
