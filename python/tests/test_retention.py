"""The retention decision alone: committed steps + metrics + policy -> steps to delete."""

import math

import pytest

from shardkeep.errors import InvalidArgumentError
from shardkeep.manager.retention import RetentionPolicy, best_steps, steps_to_delete


def steps(*numbers):
    """{step: {}} for steps without metrics."""
    return {s: {} for s in numbers}


def kept(record, policy):
    dropped = steps_to_delete(record, policy)
    return sorted(set(record) - set(dropped))


def test_no_rule_keeps_everything():
    assert steps_to_delete(steps(1, 2, 3, 4), RetentionPolicy()) == []


def test_empty_record_deletes_nothing():
    assert steps_to_delete({}, RetentionPolicy(keep_last=1)) == []


def test_keep_last():
    record = steps(10, 20, 30, 40, 50)
    assert steps_to_delete(record, RetentionPolicy(keep_last=2)) == [10, 20, 30]
    assert kept(record, RetentionPolicy(keep_last=10)) == [10, 20, 30, 40, 50]


def test_keep_last_is_by_step_number_not_insertion_order():
    record = {50: {}, 10: {}, 30: {}}
    assert steps_to_delete(record, RetentionPolicy(keep_last=1)) == [10, 30]


def test_keep_every_steps_keeps_multiples_and_the_latest():
    record = steps(*range(10, 110, 10))
    assert kept(record, RetentionPolicy(keep_every_steps=30)) == [30, 60, 90, 100]


def test_keep_best_min_and_max():
    losses = {10: {"loss": 3.0}, 20: {"loss": 1.0}, 30: {"loss": 2.0}, 40: {"loss": 5.0}}
    assert kept(losses, RetentionPolicy(keep_best=2, best_metric="loss")) == [20, 30, 40]
    accuracy = {s: {"acc": -m["loss"]} for s, m in losses.items()}
    assert kept(accuracy, RetentionPolicy(keep_best=1, best_metric="acc", best_mode="max")) \
        == [20, 40]


def test_best_ties_go_to_the_later_step():
    record = {10: {"loss": 1.0}, 20: {"loss": 1.0}, 30: {"loss": 2.0}, 40: {"loss": 9.0}}
    assert best_steps(record, "loss", "min") == [20, 10, 30, 40]
    assert kept(record, RetentionPolicy(keep_best=1, best_metric="loss")) == [20, 40]


@pytest.mark.parametrize("missing", [None, {}, {"other": 1.0}, {"loss": "low"},
                                     {"loss": None}, {"loss": True}, {"loss": math.nan},
                                     {"loss": math.inf}])
def test_step_without_usable_metric_is_never_best(missing):
    record = {10: {"loss": 5.0}, 20: missing, 30: {"loss": 4.0}, 40: {"loss": 6.0}}
    assert best_steps(record, "loss", "min") == [30, 10, 40]
    assert kept(record, RetentionPolicy(keep_best=2, best_metric="loss")) == [10, 30, 40]


def test_step_without_metric_survives_through_other_rules():
    record = {10: {"loss": 1.0}, 20: {}, 30: {"loss": 3.0}, 40: {"loss": 4.0}}
    policy = RetentionPolicy(keep_last=3, keep_best=1, best_metric="loss")
    assert kept(record, policy) == [10, 20, 30, 40]
    record[50] = {"loss": 5.0}
    assert kept(record, policy) == [10, 30, 40, 50]


def test_latest_is_kept_even_if_worst():
    record = {10: {"loss": 1.0}, 20: {"loss": 2.0}, 30: {"loss": 9.0}}
    assert kept(record, RetentionPolicy(keep_best=1, best_metric="loss")) == [10, 30]
    record[40] = {}
    assert kept(record, RetentionPolicy(keep_best=1, best_metric="loss")) == [10, 40]


def test_rules_combine_as_a_union():
    record = {s: {"loss": float(s % 7)} for s in range(5, 105, 5)}
    policy = RetentionPolicy(keep_last=2, keep_every_steps=25, keep_best=2, best_metric="loss")
    last = {95, 100}
    every = {25, 50, 75, 100}
    best = set(best_steps(record, "loss", "min", 2))
    assert best == {70, 35}  # loss 0.0, the later first
    assert kept(record, policy) == sorted(last | every | best)
    assert steps_to_delete(record, policy) == sorted(set(record) - (last | every | best))


def test_rolling_application_matches_one_shot():
    """Applying the policy after every commit ends where applying it once does."""
    policy = RetentionPolicy(keep_last=3, keep_every_steps=40, keep_best=2, best_metric="loss")
    all_steps = {s: {"loss": ((s * 37) % 11) / 10} for s in range(10, 210, 10)}
    record = {}
    for step, metrics in all_steps.items():
        record[step] = metrics
        for dropped in steps_to_delete(record, policy):
            del record[dropped]
    # The latest steps, the multiples and the overall best are never dropped
    # on the way, so the end state is exactly the one-shot decision.
    assert sorted(record) == kept(all_steps, policy)


@pytest.mark.parametrize("kwargs", [
    {"keep_last": 0}, {"keep_last": -1}, {"keep_last": 1.5}, {"keep_every_steps": 0},
    {"keep_best": 0, "best_metric": "loss"}, {"keep_best": 1},
    {"best_mode": "lowest"}, {"keep_last": True},
])
def test_invalid_policies_are_refused(kwargs):
    with pytest.raises(InvalidArgumentError):
        RetentionPolicy(**kwargs)
