"""Orbax's own policy objects, given to a shardkeep CheckpointManager, decide as
they decide under Orbax's CheckpointManager.

Each case drives both managers through the same saves (synchronous, so no
save is in flight when the next step is decided) and compares the steps
saved and kept. Where the two managers differ on purpose (shardkeep always
keeps the newest step, docs/MANAGER.md) the comparison says so.
"""

import datetime
import inspect
import pathlib
import sys
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from orbax.checkpoint import checkpoint_manager as orbax_manager_module
from orbax.checkpoint import checkpoint_managers as ocm
from orbax.checkpoint._src.checkpoint_managers import preservation_policy as orbax_preservation
from orbax.checkpoint._src.checkpoint_managers import save_decision_policy as orbax_decisions

import shardkeep as sk

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)


def state(step):
    return {"w": jnp.full((4, 2), float(step))}


class StepClock:
    """Fake time, in seconds, that the test advances between training steps."""

    def __init__(self):
        self.seconds = 0.0

    def __call__(self):  # shardkeep's ``clock``: seconds since the epoch
        return T0.timestamp() + self.seconds

    def orbax_datetime(self):
        """A stand-in for the ``datetime`` module in Orbax's manager, whose
        ``datetime.now`` reads this clock."""
        clock = self

        class Now(datetime.datetime):
            @classmethod
            def now(cls, tz=None):
                return T0 + datetime.timedelta(seconds=clock.seconds)

        return types.SimpleNamespace(datetime=Now, timezone=datetime.timezone,
                                     timedelta=datetime.timedelta)


def run_orbax(root, steps, *, save_policy=None, preservation=None, metrics=lambda s: None,
              preempted_from=None, clock=None, monkeypatch=None):
    """(steps saved, steps kept) by Orbax's own synchronous CheckpointManager."""
    if clock is not None:
        monkeypatch.setattr(orbax_manager_module, "datetime", clock.orbax_datetime())
    options = ocp.CheckpointManagerOptions(save_decision_policy=save_policy,
                                           preservation_policy=preservation,
                                           enable_async_checkpointing=False)
    with ocp.CheckpointManager(root, options=options) as mgr:
        if preempted_from is not None:
            mgr.reached_preemption = lambda step: step >= preempted_from
        saved = []
        for step in steps:
            if mgr.save(step, args=ocp.args.StandardSave(state(step)), metrics=metrics(step)):
                saved.append(step)
            if clock is not None:
                clock.seconds += 1.0
        mgr.wait_until_finished()
        return saved, mgr.all_steps()


def run_shardkeep(root, steps, *, save_policy=None, preservation=None, metrics=lambda s: None,
                  preempted_from=None, clock=None):
    """(steps saved, steps kept) by shardkeep's synchronous CheckpointManager."""
    with sk.CheckpointManager(root, save_decision_policy=save_policy,
                              preservation_policy=preservation, async_save=False,
                              clock=clock or time.time) as mgr:
        if preempted_from is not None:
            mgr.reached_preemption = lambda step: step >= preempted_from
        saved = []
        for step in steps:
            if mgr.save(step, state(step), metrics=metrics(step)):
                saved.append(step)
            if clock is not None:
                clock.seconds += 1.0
        mgr.wait()
        return saved, mgr.all_steps()


# Orbax's save-decision policies: (policy, steps the loop reaches, run
# arguments, the steps saved by Orbax's documented semantics).
SAVE_CASES = {
    "fixed-interval": (lambda: ocm.FixedIntervalPolicy(3), range(1, 12), {}, [3, 6, 9]),
    "specific-steps": (lambda: ocm.SpecificStepsPolicy([2, 5, 11]), range(12), {}, [2, 5, 11]),
    "initial": (lambda: ocm.InitialSavePolicy(), range(3, 9), {}, [3]),
    "preemption": (lambda: ocm.AnySavePolicy([ocm.FixedIntervalPolicy(4),
                                              ocm.PreemptionCheckpointingPolicy()]),
                   range(1, 11), {"preempted_from": 7}, [4, 7, 8, 9, 10]),
    # A step a second, at least 3 s apart.
    "continuous": (lambda: ocm.ContinuousCheckpointingPolicy(minimum_interval_secs=3),
                   range(11), {"clock": True}, [0, 3, 6, 9]),
    "continuous-unbounded": (lambda: ocm.ContinuousCheckpointingPolicy(), range(4), {},
                             [0, 1, 2, 3]),
    "any": (lambda: ocm.AnySavePolicy([ocm.InitialSavePolicy(), ocm.SpecificStepsPolicy([4]),
                                       ocm.FixedIntervalPolicy(5)]), range(2, 12), {},
            [2, 4, 5, 10]),
}

# Orbax's preservation policies over saves of steps 1..10 with these losses:
# (policy, the steps kept by Orbax's documented semantics plus the newest).
LOSS = {1: 3.0, 2: 2.0, 3: None, 4: 0.0, 5: 1.0, 6: 2.5, 7: 0.5, 8: 4.0, 9: 3.5, 10: 0.25}


def loss_metrics(step):
    return None if LOSS[step] is None else {"loss": LOSS[step]}


def loss(metrics):
    return metrics["loss"]


PRESERVATION_CASES = {
    "preserve-all": (lambda: orbax_preservation.PreserveAll(), list(range(1, 11))),
    "latest-n": (lambda: ocm.LatestN(3), [8, 9, 10]),
    # The oldest, then none is an hour after it.
    "every-n-seconds": (lambda: ocm.EveryNSeconds(interval_secs=3600), [1, 10]),
    "every-n-steps": (lambda: ocm.EveryNSteps(4), [4, 8, 10]),
    # 1, 4, 7, 10 (each 3 after the last kept), the newest 2 of them.
    "every-n-steps-drifting": (
        lambda: ocm.EveryNSteps(3, exact_interval=False, max_to_keep=2), [7, 10]),
    # Nearest to 0, 3, 6, 9: 1, 3, 6, 9, and the last; the newest 3 of them.
    "every-n-steps-closest": (lambda: ocm.EveryNStepsClosest(3, max_to_keep=3), [6, 9, 10]),
    "custom-steps": (lambda: ocm.CustomSteps([2, 5]), [2, 5, 10]),
    # The lowest two losses (4, 10), and 3, saved without metrics.
    "best-n": (lambda: ocm.BestN(get_metric_fn=loss, reverse=True, n=2), [3, 4, 10]),
    "latest-duration": (lambda: ocm.LatestDuration(datetime.timedelta(0)), [10]),
    # The last two, step 3, the highest loss (8).
    "any": (lambda: ocm.AnyPreservationPolicy(
        [ocm.LatestN(2), ocm.CustomSteps([3]),
         ocm.BestN(get_metric_fn=loss, n=1, keep_checkpoints_without_metrics=False)]),
        [3, 8, 9, 10]),
}


def orbax_classes(module, method):
    """The policy classes ``module`` defines (not its Protocols) that define ``method``."""
    return {cls for _, cls in inspect.getmembers(module, inspect.isclass)
            if cls.__module__ == module.__name__ and method in vars(cls)
            and not getattr(cls, "_is_protocol", False)}


def classes_in(policy):
    """The classes of ``policy`` and of the policies an Any... policy holds."""
    return {type(policy)}.union(*(classes_in(p) for p in getattr(policy, "policies", [])))


def test_every_orbax_policy_class_is_compared():
    # A policy Orbax adds fails here until it has a case below.
    assert orbax_classes(orbax_decisions, "should_save") == set().union(
        *(classes_in(make()) for make, *_ in SAVE_CASES.values()))
    assert orbax_classes(orbax_preservation, "should_preserve") == set().union(
        *(classes_in(make()) for make, _ in PRESERVATION_CASES.values()))


@pytest.mark.parametrize("name", sorted(SAVE_CASES))
def test_orbax_save_decision_policies_save_the_steps_orbax_saves(name, tmp_path, monkeypatch):
    make, steps, kwargs, expected = SAVE_CASES[name]
    orbax_kwargs, shardkeep_kwargs = dict(kwargs), dict(kwargs)
    if kwargs.get("clock"):
        orbax_kwargs["clock"], shardkeep_kwargs["clock"] = StepClock(), StepClock()
    orbax_saved, _ = run_orbax(tmp_path / "orbax", steps, save_policy=make(),
                               monkeypatch=monkeypatch, **orbax_kwargs)
    saved, kept = run_shardkeep(tmp_path / "shardkeep", steps, save_policy=make(),
                                **shardkeep_kwargs)
    assert saved == orbax_saved == expected
    assert kept == saved  # no preservation policy: every step is kept


@pytest.mark.parametrize("name", sorted(PRESERVATION_CASES))
def test_orbax_preservation_policies_keep_the_steps_orbax_keeps(name, tmp_path, monkeypatch):
    make, expected = PRESERVATION_CASES[name]
    steps = range(1, 11)
    _, orbax_kept = run_orbax(tmp_path / "orbax", steps, preservation=make(),
                              metrics=loss_metrics, monkeypatch=monkeypatch)
    saved, kept = run_shardkeep(tmp_path / "shardkeep", steps, preservation=make(),
                                metrics=loss_metrics)
    assert saved == list(steps)
    # Orbax may delete the step it has just saved; shardkeep keeps the newest.
    assert kept == sorted(set(orbax_kept) | {10}) == expected


def test_a_preservation_policy_that_raises_fails_the_next_call_and_deletes_nothing(tmp_path):
    # Orbax's BestN asks get_metric_fn of every step with metrics: one
    # without "loss" raises KeyError, in shardkeep's background worker.
    policy = ocm.BestN(get_metric_fn=loss, n=1)
    with sk.CheckpointManager(tmp_path, preservation_policy=policy, async_save=False) as mgr:
        mgr.save(1, state(1), metrics={"loss": 1.0})
        with pytest.raises(KeyError, match="preservation policy failed once step 2"):
            mgr.save(2, state(2), metrics={"accuracy": 0.5})  # waits for the commit
        assert mgr.all_steps() == [1, 2]
        policy.get_metric_fn = lambda m: m.get("loss", 0.0)
        assert mgr.save(4, state(4), metrics={"loss": 2.0})
        assert mgr.all_steps() == [4]  # the policy works again


def test_the_context_carries_what_orbax_policies_read(tmp_path):
    seen = []

    class Spy(ocm.FixedIntervalPolicy):  # a user's subclass: asked on the primary
        def should_save(self, step, previous_steps, *, context):
            seen.append((step, list(previous_steps), context))
            return super().should_save(step, previous_steps, context=context)

    with sk.CheckpointManager(tmp_path, save_decision_policy=Spy(2), async_save=False) as mgr:
        for step in range(1, 4):
            mgr.save(step, state(step), metrics={"loss": 1.0} if step == 2 else None)
    step, previous, context = seen[-1]
    assert step.step == 3 and step.metrics is None and step.time.tzinfo is not None
    assert [(p.step, p.metrics) for p in previous] == [(2, {"loss": 1.0})]
    options = context.multiprocessing_options
    assert (options.primary_host, options.active_processes,
            options.barrier_sync_key_prefix) == (0, None, None)
    assert context.is_saving_in_progress is False and context.reached_preemption is False


class Model(nnx.Module):
    def __init__(self, rngs):
        self.hidden = nnx.Linear(8, 16, rngs=rngs)
        self.out = nnx.Linear(16, 2, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x)))


@nnx.jit
def train_step(model, optimizer, x, y):
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
    optimizer.update(model, grads)
    return loss


def new_optimizer(model):
    return nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)


def test_continuous_checkpointing_in_a_training_loop(tmp_path):
    """Orbax's ContinuousCheckpointingPolicy and LatestN driving async saves
    of a Flax NNX model and its optax state: a save starts only once the one
    before has committed and at least 3 (fake) seconds after it; the last two
    are kept and the latest restores the state it was saved from."""
    model = Model(nnx.Rngs(0))
    optimizer = new_optimizer(model)
    clock = StepClock()
    rng = np.random.default_rng(0)
    saved, states, committed = [], {}, {}
    with sk.CheckpointManager(
            tmp_path, save_decision_policy=ocm.ContinuousCheckpointingPolicy(
                minimum_interval_secs=3),
            preservation_policy=ocm.LatestN(2), clock=clock) as mgr:
        step, deadline = 0, time.monotonic() + 120
        while len(saved) < 4:
            assert time.monotonic() < deadline, saved
            x = jnp.asarray(rng.normal(size=(4, 8)), jnp.float32)
            loss_value = train_step(model, optimizer, x, jnp.zeros((4, 2)))
            step += 1
            train = sk.Checkpointables(model=nnx.state(model), opt=nnx.state(optimizer))
            if mgr.save(step, train, metrics={"loss": loss_value}):
                saved.append(step)
                states[step] = [np.asarray(a) for a in jax.tree.leaves(
                    (nnx.state(model), nnx.state(optimizer)))]
                committed[step] = mgr.all_steps()
            clock.seconds += 1.0
            time.sleep(0.002)
        mgr.wait()
        assert all(b - a >= 3 for a, b in zip(saved, saved[1:])), saved
        # Never a save while one was in flight: the one before had committed.
        assert all(a in committed[b] for a, b in zip(saved, saved[1:])), (saved, committed)
        assert mgr.all_steps() == saved[-2:]
        restored = mgr.load(saved[-1], sk.Checkpointables(
            model=nnx.state(nnx.eval_shape(lambda: Model(nnx.Rngs(1)))),
            opt=nnx.state(nnx.eval_shape(lambda: new_optimizer(Model(nnx.Rngs(1)))))))
    got = [np.asarray(a) for a in jax.tree.leaves((restored["model"], restored["opt"]))]
    want = states[saved[-1]]
    assert len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want))


def test_two_processes_decide_orbax_step_policies_alike(tmp_path):
    """Orbax's step-only policies are asked on every process (the steps they
    name are saved exactly, as Orbax saves them), its continuous policy on
    the primary only; both processes save the same steps."""
    sys.path.insert(0, str(pathlib.Path(__file__).with_name("multiprocess")))
    import harness

    first, second = harness.run_job(2, 2, "manager_scenarios:orbax_policies_job",
                                    {"root": str(tmp_path / "run"), "steps": 100}, timeout=180)
    assert first["saved"] == second["saved"]
    fixed = set(range(0, 100, 25))
    assert fixed <= set(first["saved"])
    assert set(first["saved"]) - fixed  # the continuous policy saved too
