"""Resume equivalence on a tiny version of the demo model.

A run that stops and resumes from its latest checkpoint must produce the
same losses and parameters, bit for bit, as a run that never stopped: the
checkpoint holds the whole training state and the data depends on the step
alone.
"""

import os
import sys

import jax
import numpy as np

from conftest import assert_same_bits

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "demo"))
import model  # noqa: E402
import train  # noqa: E402

TINY = model.Config(vocab=32, d_model=16, heads=2, layers=1, d_ff=32, seq=8, batch=8)


def quiet(_line):
    pass


def test_resumed_run_matches_an_uninterrupted_one(tmp_path):
    steps, every = 10, 3
    reference, final = train.train(TINY, str(tmp_path / "a"), steps=steps, save_every=every,
                                   log=quiet)
    assert sorted(reference) == list(range(steps))

    before, _ = train.train(TINY, str(tmp_path / "b"), steps=steps, save_every=every,
                            stop_after=7, log=quiet)
    assert sorted(before) == list(range(8))  # stopped after step 7; last checkpoint: 6
    after, resumed = train.train(TINY, str(tmp_path / "b"), steps=steps, save_every=every,
                                 log=quiet)
    assert sorted(after) == list(range(6, steps))
    for step, bits in {**before, **after}.items():
        assert bits == reference[step], f"loss of step {step} differs"
    for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(resumed)):
        assert a.sharding == b.sharding
        assert_same_bits(np.asarray(b), np.asarray(a))
    assert len(set(reference.values())) > 5  # the losses really change from step to step
