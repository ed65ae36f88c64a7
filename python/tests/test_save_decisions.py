"""Save-decision policies: alone, under a manager with an injected clock, and the
agreement that lands the primary's decisions on one step for every process."""

import datetime
import pathlib
import random
import sys
import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest

import shardkeep as sk
from shardkeep.errors import TimeoutError as ShardkeepTimeout
from shardkeep.manager.policy_info import PolicyCheckpointInfo
from shardkeep.manager.save_decisions import (AnySavePolicy, ContinuousCheckpointingPolicy,
                                              DecisionContext, FixedIntervalPolicy,
                                              InitialSavePolicy,
                                              PreemptionCheckpointingPolicy,
                                              SpecificStepsPolicy)
from shardkeep.manager.step_agreement import StepAgreement

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
IDLE = DecisionContext(is_saving_in_progress=False, reached_preemption=False)


def at(step, seconds=0.0):
    return PolicyCheckpointInfo(step, None, T0 + datetime.timedelta(seconds=seconds))


def test_step_policies():
    assert [s for s in range(10) if FixedIntervalPolicy(3).should_save(at(s), [], context=IDLE)] \
        == [0, 3, 6, 9]
    assert [s for s in range(10)
            if SpecificStepsPolicy({2, 7}).should_save(at(s), [], context=IDLE)] == [2, 7]
    assert InitialSavePolicy().should_save(at(5), [], context=IDLE)
    assert not InitialSavePolicy().should_save(at(5), [at(1)], context=IDLE)
    preempted = DecisionContext(is_saving_in_progress=True, reached_preemption=True)
    assert PreemptionCheckpointingPolicy().should_save(at(5), [], context=preempted)
    assert not PreemptionCheckpointingPolicy().should_save(at(5), [], context=IDLE)
    either = AnySavePolicy([FixedIntervalPolicy(5), SpecificStepsPolicy([3])])
    assert [s for s in range(11) if either.should_save(at(s), [], context=IDLE)] == [0, 3, 5, 10]


def test_continuous_waits_for_the_save_in_flight_and_the_minimum_interval():
    policy = ContinuousCheckpointingPolicy(minimum_interval_secs=60)
    busy = DecisionContext(is_saving_in_progress=True, reached_preemption=False)
    assert policy.should_save(at(1, 0), [], context=IDLE)
    assert not policy.should_save(at(2, 1000), [at(1, 0)], context=busy)
    assert not policy.should_save(at(2, 59), [at(1, 0)], context=IDLE)
    assert policy.should_save(at(2, 60), [at(1, 0)], context=IDLE)
    assert ContinuousCheckpointingPolicy().should_save(at(2, 0.001), [at(1, 0)], context=IDLE)


class FakeClock:
    """Real time plus a jump the test makes: commit records carry real times."""

    def __init__(self):
        self.ahead = 0.0

    def __call__(self):
        return time.time() + self.ahead


def state(step):
    return {"w": jnp.full((8, 4), float(step)), "step": np.int64(step)}


def test_continuous_saves_under_a_manager_follow_the_clock(tmp_path):
    clock = FakeClock()
    policy = ContinuousCheckpointingPolicy(minimum_interval_secs=5)
    with sk.CheckpointManager(tmp_path, save_decision_policy=policy, async_save=False,
                              clock=clock) as mgr:
        saved = []
        for step in range(16):
            if mgr.save(step, state(step)):
                saved.append(step)
            clock.ahead += 1.0  # each step takes a second
        assert saved == [0, 5, 10, 15]
        assert mgr.all_steps() == saved


def test_is_saving_in_progress_is_false_only_once_the_last_save_committed(tmp_path):
    answers = []

    class WhenIdle:
        same_on_every_process = False

        def should_save(self, step, previous_steps, *, context):
            # Idle means the last save started has committed.
            committed = mgr.all_steps()
            idle = not previous_steps or previous_steps[-1].step in committed
            answers.append((context.is_saving_in_progress, idle))
            return not context.is_saving_in_progress

    with sk.CheckpointManager(tmp_path, save_decision_policy=WhenIdle()) as mgr:
        # Steps until a save was refused as busy and a later one started: a
        # loaded machine may take many steps to commit the first.
        started, step = [], 0
        deadline = time.monotonic() + 120
        while len(started) < 2 or not any(busy for busy, _ in answers):
            assert time.monotonic() < deadline, (started, answers[-5:])
            if mgr.save(step, state(step)):
                started.append(step)
            step += 1
        mgr.wait()
        assert mgr.all_steps() == started
    assert all(idle for busy, idle in answers if not busy)


def test_initial_save_policy_saves_a_fresh_root_once(tmp_path):
    policy = AnySavePolicy([InitialSavePolicy(), FixedIntervalPolicy(10)])
    with sk.CheckpointManager(tmp_path, save_decision_policy=policy) as mgr:
        assert [s for s in range(3, 12) if mgr.save(s, state(s))] == [3, 10]
    with sk.CheckpointManager(tmp_path, save_decision_policy=policy) as mgr:
        assert [s for s in range(12, 21) if mgr.save(s, state(s))] == [20]


def test_an_explicit_policy_saves_on_preemption_only_if_it_says_so(tmp_path, monkeypatch):
    for policy, expected in [(FixedIntervalPolicy(100), []),
                             (AnySavePolicy([FixedIntervalPolicy(100),
                                             PreemptionCheckpointingPolicy()]), [7])]:
        root = tmp_path / type(policy).__name__
        with sk.CheckpointManager(root, save_decision_policy=policy) as mgr:
            monkeypatch.setattr(mgr, "reached_preemption", lambda step: step == 7)
            assert [s for s in range(1, 9) if mgr.save(s, state(s))] == expected


def test_policy_arguments_are_checked(tmp_path):
    with pytest.raises(sk.InvalidArgumentError, match="not both"):
        sk.CheckpointManager(tmp_path, save_interval_steps=2,
                             save_decision_policy=FixedIntervalPolicy(2))
    with pytest.raises(sk.InvalidArgumentError, match="should_save"):
        sk.CheckpointManager(tmp_path, save_decision_policy=object())
    with pytest.raises(sk.InvalidArgumentError, match="minimum_interval_secs"):
        ContinuousCheckpointingPolicy(minimum_interval_secs=-1)
    with pytest.raises(sk.InvalidArgumentError, match="decision_lead_steps"):
        sk.CheckpointManager(tmp_path, decision_lead_steps=0)


def test_the_local_tier_takes_a_decision_policy(tmp_path):
    with sk.CheckpointManager(tmp_path / "persistent", save_interval_steps=100,
                              local_root=str(tmp_path / "local{process}"),
                              local_save_decision_policy=SpecificStepsPolicy({2, 5}),
                              local_keep_last=5) as mgr:
        for step in range(1, 8):
            mgr.save(step, state(step))
        mgr.wait()
        assert mgr.local_steps() == {0: [2, 5]}
    with pytest.raises(sk.InvalidArgumentError, match="one of them"):
        sk.CheckpointManager(tmp_path / "p", local_root=str(tmp_path / "l"),
                             local_save_interval_steps=2,
                             local_save_decision_policy=SpecificStepsPolicy({2}))


# -- the agreement, with processes as threads over an in-memory service ------

class Service:
    """A key-value store with blocking reads, like JAX's coordination service."""

    def __init__(self):
        self.values: dict[str, str] = {}
        self.changed = threading.Condition()

    def view(self, index, count):
        return _View(self, index, count)


class _View:
    def __init__(self, service, index, count):
        self.service, self.process_index, self.process_count = service, index, count

    def set(self, key, value):
        with self.service.changed:
            assert key not in self.service.values, key
            self.service.values[key] = value
            self.service.changed.notify_all()

    def get(self, key, timeout_s):
        with self.service.changed:
            if not self.service.changed.wait_for(lambda: key in self.service.values, timeout_s):
                raise ShardkeepTimeout(f"{key} not set")
            return self.service.values[key]


@pytest.mark.parametrize("seed", range(6))
def test_every_process_saves_the_steps_the_primary_decided(seed):
    """Loops at uneven speeds, the primary deciding at random steps: every
    process saves the same steps, each at or after the step decided."""
    count, steps, lead = 3, 150, 2
    service = Service()
    rng = random.Random(seed)
    yes = {s for s in range(steps) if rng.random() < 0.15}
    delays = [[rng.random() * 0.002 for _ in range(steps)] for _ in range(count)]
    saved: list[list[int]] = [[] for _ in range(count)]
    decided: list[int] = []
    errors = []

    def loop(i):
        agreement = StepAgreement(service.view(i, count), "job/saves", lead=lead, timeout_s=20)
        try:
            for step in range(steps):
                time.sleep(delays[i][step])

                def primary_says(step=step):
                    if step in yes:
                        decided.append(step)
                        return True
                    return False
                if agreement.due(step, primary_says):
                    saved[i].append(step)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
        finally:
            agreement.close()

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert saved[0] == saved[1] == saved[2]
    assert len(saved[0]) >= 2
    # Each decision lands at least `lead` steps later, and no decision is
    # taken while one is pending.
    assert all(s >= d + lead for d, s in zip(decided, saved[0]))
    assert len(decided) - len(saved[0]) in (0, 1)  # the last one may land past the end


def test_a_process_that_reaches_the_step_before_it_is_announced_waits_then_fails():
    service = Service()
    follower = StepAgreement(service.view(1, 2), "job/saves", lead=1, timeout_s=0.5)
    try:
        service.view(0, 2).set("job/saves/0/open", "4")
        deadline = time.monotonic() + 5
        while "job/saves/0/step/1" not in service.values and time.monotonic() < deadline:
            follower.due(4, lambda: False)
            time.sleep(0.01)
        recorded = int(service.values["job/saves/0/step/1"])
        assert not follower.due(recorded, lambda: False)  # the step itself is never the one
        with pytest.raises(ShardkeepTimeout, match="was not announced by process 0"):
            follower.due(recorded + 1, lambda: False)
    finally:
        follower.close()


class _Unanswered:
    """Process 1's view of a service where no key ever appears: each get
    waits until its timeout or ``release()``, and the gets are counted."""

    process_index, process_count = 1, 2

    def __init__(self):
        self.values: dict[str, str] = {}
        self.timeouts: list[float] = []  # of each get begun
        self.unfinished = 0              # gets begun and not yet returned
        self.first_get = threading.Event()
        self.second_get = threading.Event()
        self._released = threading.Event()

    def set(self, key, value):
        self.values[key] = value

    def get(self, key, timeout_s):
        self.timeouts.append(timeout_s)
        self.unfinished += 1
        (self.second_get if self.first_get.is_set() else self.first_get).set()
        try:
            self._released.wait(timeout_s)
            raise ShardkeepTimeout(f"{key} not set")
        finally:
            self.unfinished -= 1

    def release(self):
        self._released.set()


def _agents(name):
    return [t for t in threading.enumerate() if t.name == f"shardkeep-agreement-{name}"]


def test_close_stops_a_follower_whose_get_is_unanswered_without_waiting_for_the_get():
    bridge = _Unanswered()
    follower = StepAgreement(bridge, "job/unanswered", lead=1, timeout_s=600)
    try:
        assert bridge.first_get.wait(60)  # the agent waits for round 0 to open
        assert not follower.due(3, lambda: False)
        follower.close()
        # close returned and its agent ended while the get still blocks.
        assert bridge.unfinished == 1 and _agents("unanswered") == []
        assert bridge.values == {"job/unanswered/0/step/1": "3"}  # for a primary behind
    finally:
        bridge.release()


def test_an_idle_follower_makes_one_request_not_one_per_interval():
    bridge = _Unanswered()
    follower = StepAgreement(bridge, "job/idle", lead=1, timeout_s=600)
    try:
        assert bridge.first_get.wait(60)
        # The get lasts as long as the agreement's own timeout; the key's
        # arrival, not a short interval, would end it.
        assert bridge.timeouts == [600]
        assert not bridge.second_get.wait(2.0)  # the old agent asked again each second
        assert len(bridge.timeouts) == 1
    finally:
        follower.close()
        bridge.release()


def test_two_processes_with_offset_clocks_save_the_same_steps(tmp_path):
    """A real 2-process job saving continuously (minimum interval 0.2 s)
    whose clocks disagree by 10 s: both save the same steps."""
    multiprocess = pathlib.Path(__file__).with_name("multiprocess")
    sys.path.insert(0, str(multiprocess))
    import harness

    results = harness.run_job(2, 2, "manager_scenarios:continuous_job",
                              {"root": str(tmp_path / "run"), "clock_offsets": [-3.0, 7.0],
                               "steps": 120}, timeout=180)
    first, second = results
    assert first["saved"] == second["saved"]
    assert len(first["saved"]) >= 3
    assert first["steps"] == second["steps"] == first["saved"][-3:]
