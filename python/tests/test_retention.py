"""Preservation policies alone: committed checkpoints + policy -> steps to delete."""

import datetime
import math
import operator

import pytest

from shardkeep.errors import InvalidArgumentError
from shardkeep.manager import policy_arguments
from shardkeep.manager.policy_info import PolicyCheckpointInfo
from shardkeep.manager.preservation import (AnyPreservationPolicy, BestN, CustomSteps,
                                            EveryNSeconds, EveryNSteps, EveryNStepsClosest,
                                            LatestDuration, LatestN, PreserveAll,
                                            steps_to_delete)

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)


def infos(*steps, metrics=None, seconds=None):
    """Checkpoints of ``steps``; ``metrics`` and ``seconds`` (after T0) per step."""
    return [PolicyCheckpointInfo(s, (metrics or {}).get(s, {}),
                                 T0 + datetime.timedelta(seconds=(seconds or {}).get(s, s)))
            for s in steps]


def kept(checkpoints, policy):
    dropped = set(steps_to_delete(checkpoints, policy))
    return [c.step for c in checkpoints if c.step not in dropped]


def short(**kwargs):
    """The policy the manager's short arguments stand for."""
    kwargs = {"keep_last": None, "keep_every_steps": None, "keep_best": None,
              "best_metric": None, "best_mode": "min", **kwargs}
    return policy_arguments.preservation_policy(None, **kwargs)[0]


def test_preserve_all_and_empty():
    assert steps_to_delete(infos(1, 2, 3), PreserveAll()) == []
    assert steps_to_delete([], LatestN(1)) == []
    assert isinstance(short(), PreserveAll)


def test_latest_n():
    record = infos(10, 20, 30, 40, 50)
    assert steps_to_delete(record, LatestN(2)) == [10, 20, 30]
    assert kept(record, LatestN(10)) == [10, 20, 30, 40, 50]
    assert kept(record, LatestN(None)) == [10, 20, 30, 40, 50]


def test_order_is_by_step_not_by_argument_order():
    assert steps_to_delete(infos(50, 10, 30), LatestN(1)) == [10, 30]


def test_every_n_steps_exact_and_drifting():
    record = infos(*range(10, 110, 10))
    # The newest is always kept on top of the multiples.
    assert kept(record, EveryNSteps(30)) == [30, 60, 90, 100]
    assert kept(record, EveryNSteps(30, max_to_keep=2)) == [60, 90, 100]
    irregular = infos(3, 9, 14, 22, 31, 33)
    assert kept(irregular, EveryNSteps(10, exact_interval=False)) == [3, 14, 31, 33]


def test_every_n_steps_closest_keeps_the_nearest_and_the_last():
    record = infos(9, 12, 19, 22, 28, 33)
    # 10 <- 9 (distance 1), 20 <- 19 and 22 tie at... 19 is 1 away, 22 is 2:
    # 19; 30 <- 28 (2) vs 33 (3): 28; the last, 33, always.
    assert kept(record, EveryNStepsClosest(10)) == [9, 19, 28, 33]
    tie = infos(8, 12, 13)
    assert kept(tie, EveryNStepsClosest(10)) == [12, 13]  # a tie goes to the later
    assert kept(record, EveryNStepsClosest(10, max_to_keep=2)) == [28, 33]


def test_custom_steps():
    assert kept(infos(1, 2, 3, 4, 5), CustomSteps([2, 4])) == [2, 4, 5]


def test_every_n_seconds_uses_recorded_times():
    seconds = {1: 0, 2: 30, 3: 59, 4: 61, 5: 100, 6: 125}
    record = infos(*seconds, seconds=seconds)
    assert kept(record, EveryNSeconds(60)) == [1, 4, 6]


def test_latest_duration_measures_from_the_newest_checkpoint():
    seconds = {1: 0, 2: 3000, 3: 6000, 4: 7000}
    record = infos(*seconds, seconds=seconds)
    assert kept(record, LatestDuration(datetime.timedelta(seconds=3600))) == [3, 4]
    # However old every checkpoint is, the newest stays.
    assert kept(record, LatestDuration(datetime.timedelta(0))) == [4]


def test_best_n_by_a_metric_function():
    losses = {10: {"loss": 3.0}, 20: {"loss": 1.0}, 30: {"loss": 2.0}, 40: {"loss": 5.0}}
    record = infos(*losses, metrics=losses)
    loss = operator.itemgetter("loss")
    # As in Orbax: ascending order, the last n kept, so reverse=True keeps the lowest.
    assert kept(record, BestN(get_metric_fn=loss, reverse=True, n=2)) == [20, 30, 40]
    assert kept(record, BestN(get_metric_fn=loss, n=1)) == [40]
    assert kept(record, BestN(get_metric_fn=loss, n=None)) == [10, 20, 30, 40]
    assert kept(record, BestN(get_metric_fn=loss, n=0)) == [40]


def test_best_n_ties_go_to_the_later_step():
    losses = {10: {"loss": 1.0}, 20: {"loss": 1.0}, 30: {"loss": 2.0}, 40: {"loss": 9.0}}
    record = infos(*losses, metrics=losses)
    best = BestN(get_metric_fn=operator.itemgetter("loss"), reverse=True, n=1)
    assert [c.step for c in best.ranked(record)] == [20, 10, 30, 40]
    assert kept(record, best) == [20, 40]


@pytest.mark.parametrize("missing", [None, {}, {"other": 1.0}, {"loss": "low"},
                                     {"loss": None}, {"loss": True}, {"loss": math.nan},
                                     {"loss": math.inf}])
@pytest.mark.parametrize("keep_without", [True, False])
def test_best_n_with_checkpoints_that_lack_the_metric(missing, keep_without):
    metrics = {10: {"loss": 5.0}, 20: missing, 30: {"loss": 4.0}, 40: {"loss": 6.0}}
    record = infos(*metrics, metrics=metrics)
    best = BestN(get_metric_fn=operator.itemgetter("loss"), reverse=True, n=1,
                 keep_checkpoints_without_metrics=keep_without)
    assert [c.step for c in best.ranked(record)] == [30, 10, 40]
    assert kept(record, best) == ([20, 30, 40] if keep_without else [30, 40])


def test_short_arguments_never_keep_steps_for_lacking_the_metric():
    metrics = {10: {"loss": 1.0}, 20: {}, 30: {"loss": 3.0}, 40: {"loss": 4.0}}
    policy = short(keep_last=3, keep_best=1, best_metric="loss")
    record = infos(*metrics, metrics=metrics)
    assert kept(record, policy) == [10, 20, 30, 40]
    record += infos(50, metrics={50: {"loss": 5.0}})
    assert kept(record, policy) == [10, 30, 40, 50]


def test_the_newest_is_kept_even_if_worst():
    metrics = {10: {"loss": 1.0}, 20: {"loss": 2.0}, 30: {"loss": 9.0}}
    policy = short(keep_best=1, best_metric="loss")
    assert kept(infos(*metrics, metrics=metrics), policy) == [10, 30]
    metrics[40] = {}
    assert kept(infos(*metrics, metrics=metrics), policy) == [10, 40]


def test_rules_combine_as_a_union():
    metrics = {s: {"loss": float(s % 7)} for s in range(5, 105, 5)}
    record = infos(*metrics, metrics=metrics)
    policy = AnyPreservationPolicy([
        LatestN(2), EveryNSteps(25),
        BestN(get_metric_fn=operator.itemgetter("loss"), reverse=True, n=2)])
    assert kept(record, policy) == sorted({95, 100} | {25, 50, 75, 100} | {70, 35})
    assert kept(record, short(keep_last=2, keep_every_steps=25, keep_best=2,
                              best_metric="loss")) == kept(record, policy)


def test_rolling_application_matches_one_shot():
    """Applying the policy after every commit ends where applying it once does."""
    policy = short(keep_last=3, keep_every_steps=40, keep_best=2, best_metric="loss")
    metrics = {s: {"loss": ((s * 37) % 11) / 10} for s in range(10, 210, 10)}
    everything = infos(*metrics, metrics=metrics)
    record: list = []
    for info in everything:
        record.append(info)
        dropped = set(steps_to_delete(record, policy))
        record = [c for c in record if c.step not in dropped]
    # The latest steps, the multiples and the overall best are never dropped
    # on the way, so the end state is exactly the one-shot decision.
    assert [c.step for c in record] == kept(everything, policy)


def test_a_users_own_policy_is_asked_and_checked():
    class KeepOdd:
        def should_preserve(self, checkpoints, *, context):
            return [c.step % 2 == 1 for c in checkpoints]

    class Short:
        def should_preserve(self, checkpoints, *, context):
            return [True]

    assert kept(infos(1, 2, 3, 4), KeepOdd()) == [1, 3, 4]
    with pytest.raises(InvalidArgumentError, match="1 answers for 3"):
        steps_to_delete(infos(1, 2, 3), Short())


@pytest.mark.parametrize("make", [
    lambda: LatestN(0), lambda: EveryNSteps(0), lambda: EveryNStepsClosest(-1),
    lambda: EveryNSeconds(-1), lambda: LatestDuration(5), lambda: BestN(get_metric_fn=None),
    lambda: BestN(get_metric_fn=len, n=-1), lambda: EveryNSteps(10, max_to_keep=1.5),
    lambda: AnyPreservationPolicy([object()]),
])
def test_invalid_policies_are_refused(make):
    with pytest.raises(InvalidArgumentError):
        make()


@pytest.mark.parametrize("kwargs", [
    {"keep_last": 0}, {"keep_last": -1}, {"keep_last": 1.5}, {"keep_every_steps": 0},
    {"keep_best": 0, "best_metric": "loss"}, {"keep_best": 1},
    {"best_mode": "lowest"}, {"keep_last": True},
])
def test_invalid_short_arguments_are_refused(kwargs):
    with pytest.raises(InvalidArgumentError):
        short(**kwargs)


def test_a_policy_and_its_short_arguments_are_not_both_taken():
    with pytest.raises(InvalidArgumentError, match="not both"):
        policy_arguments.preservation_policy(
            LatestN(1), keep_last=2, keep_every_steps=None, keep_best=None, best_metric=None,
            best_mode="min")


def test_durations_carry_across_a_restart(tmp_path):
    """Ages come from the commit records: steps saved before a restart are
    as old as their records say, whatever the file system says."""
    import os
    import time

    import numpy as np

    import shardkeep as sk

    policy = LatestDuration(datetime.timedelta(seconds=1.5))
    with sk.CheckpointManager(tmp_path, preservation_policy=policy) as mgr:
        for step in (1, 2):
            mgr.save(step, {"x": np.full(4, step)})
        mgr.wait()
        assert mgr.all_steps() == [1, 2]
    time.sleep(2.0)
    for step in (1, 2):  # touching the folders makes them look new to the file system
        os.utime(tmp_path / f"{step:09d}")
    with sk.CheckpointManager(tmp_path, preservation_policy=policy) as mgr:
        assert mgr.all_steps() == [1, 2]  # nothing is deleted before a commit
        mgr.save(3, {"x": np.full(4, 3)})
        mgr.wait()
        assert mgr.all_steps() == [3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["000000003"]


def test_best_step_follows_the_first_best_n_of_a_policy(tmp_path):
    import numpy as np

    import shardkeep as sk

    policy = AnyPreservationPolicy([LatestN(1), BestN(get_metric_fn=lambda m: m["acc"], n=1)])
    with sk.CheckpointManager(tmp_path, preservation_policy=policy) as mgr:
        for step, acc in [(1, 0.5), (2, 0.9), (3, 0.7), (4, 0.6)]:
            mgr.save(step, {"x": np.full(4, step)}, metrics={"acc": acc})
        mgr.wait()
        assert mgr.best_step() == 2
        assert mgr.all_steps() == [2, 4]
