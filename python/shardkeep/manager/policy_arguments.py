"""The CheckpointManager's short arguments as the policies they stand for.

``save_interval_steps=n`` is ``AnySavePolicy([FixedIntervalPolicy(n),
PreemptionCheckpointingPolicy()])``; ``keep_last``, ``keep_every_steps``
and ``keep_best`` are ``LatestN``, ``EveryNSteps`` and ``BestN`` under an
``AnyPreservationPolicy``. A short argument and the policy it stands for
cannot both be given: which one would win is not obvious.
"""

from __future__ import annotations

import operator

from ..errors import InvalidArgumentError
from . import preservation, save_decisions


def save_policy(policy: save_decisions.SaveDecisionPolicy | None,
                interval: int | None) -> save_decisions.SaveDecisionPolicy:
    if policy is not None:
        if interval is not None:
            raise InvalidArgumentError(
                "give save_decision_policy or save_interval_steps, not both")
        save_decisions.check_policy(policy)
        return policy
    return save_decisions.AnySavePolicy([
        save_decisions.FixedIntervalPolicy(_positive("save_interval_steps", interval, 1)),
        save_decisions.PreemptionCheckpointingPolicy()])


def local_save_policy(local_root, policy: save_decisions.SaveDecisionPolicy | None,
                      interval: int | None, keep_last: int
                      ) -> save_decisions.SaveDecisionPolicy | None:
    """The local tier's save policy; None without a ``local_root``."""
    if local_root is None:
        if interval is not None or policy is not None:
            raise InvalidArgumentError("local_save_interval_steps and"
                                       " local_save_decision_policy need a local_root")
        return None
    save_decisions.check_positive("local_keep_last", keep_last)
    if (policy is None) == (interval is None):
        raise InvalidArgumentError("a local_root needs local_save_interval_steps or"
                                   " local_save_decision_policy (one of them)")
    if policy is not None:
        save_decisions.check_policy(policy)
        return policy
    return save_decisions.FixedIntervalPolicy(_positive("local_save_interval_steps", interval))


def preservation_policy(policy: preservation.PreservationPolicy | None, *,
                        keep_last: int | None, keep_every_steps: int | None,
                        keep_best: int | None, best_metric: str | None, best_mode: str
                        ) -> tuple[preservation.PreservationPolicy, preservation.BestN | None]:
    """The policy, and the ``BestN`` that ranks steps for ``best_step`` (or None)."""
    if best_mode not in ("min", "max"):
        raise InvalidArgumentError(f"best_mode must be 'min' or 'max', got {best_mode!r}")
    rank = None
    if best_metric is not None:
        rank = preservation.BestN(get_metric_fn=operator.itemgetter(best_metric),
                                  reverse=best_mode == "min", n=keep_best,
                                  keep_checkpoints_without_metrics=False)
    if policy is not None:
        if (keep_last, keep_every_steps, keep_best) != (None, None, None):
            raise InvalidArgumentError(
                "give preservation_policy or keep_last/keep_every_steps/keep_best, not both")
        preservation.check_policy(policy)
        return policy, rank if rank is not None else preservation.first_best(policy)
    rules: list[preservation.PreservationPolicy] = []
    if keep_last is not None:
        rules.append(preservation.LatestN(_positive("keep_last", keep_last)))
    if keep_every_steps is not None:
        rules.append(preservation.EveryNSteps(_positive("keep_every_steps", keep_every_steps)))
    if keep_best is not None:
        _positive("keep_best", keep_best)
        if rank is None:
            raise InvalidArgumentError("keep_best needs best_metric: the metric to rank steps by")
        rules.append(rank)
    if not rules:
        return preservation.PreserveAll(), rank
    return preservation.AnyPreservationPolicy(rules), rank


def _positive(name: str, value, default: int | None = None) -> int:
    if value is None and default is not None:
        return default
    save_decisions.check_positive(name, value)
    return value
