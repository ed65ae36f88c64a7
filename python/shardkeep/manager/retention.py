"""Which committed checkpoints a CheckpointManager keeps: a pure decision.

A step is kept when any rule keeps it:

* it is the latest committed step (a job can always resume);
* it is among the ``keep_last`` most recent steps;
* it is a multiple of ``keep_every_steps``;
* it is among the ``keep_best`` best steps by the metric ``best_metric``.

A step without a usable value for ``best_metric`` (missing, not a number,
NaN or infinite) is never among the best: it is kept only by the other
rules. With no rule configured every step is kept. See docs/MANAGER.md.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

from ..errors import InvalidArgumentError


@dataclasses.dataclass(frozen=True)
class RetentionPolicy:
    """The retention rules; None switches a rule off."""

    keep_last: int | None = None
    keep_every_steps: int | None = None
    keep_best: int | None = None
    best_metric: str | None = None
    best_mode: str = "min"

    def __post_init__(self):
        for name in ("keep_last", "keep_every_steps", "keep_best"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise InvalidArgumentError(f"{name} must be None or an int >= 1, got {value!r}")
        if self.best_mode not in ("min", "max"):
            raise InvalidArgumentError(f"best_mode must be 'min' or 'max', got {self.best_mode!r}")
        if self.keep_best is not None and self.best_metric is None:
            raise InvalidArgumentError("keep_best needs best_metric: the metric to rank steps by")

    @property
    def keeps_everything(self) -> bool:
        return self.keep_last is None and self.keep_every_steps is None and self.keep_best is None


def metric_value(metrics: Mapping | None, name: str | None) -> float | None:
    """The finite number ``metrics[name]``, or None when it is not usable."""
    if name is None or not isinstance(metrics, Mapping):
        return None
    value = metrics.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def best_steps(metrics_by_step: Mapping[int, Mapping | None], metric: str | None,
               mode: str, count: int | None = None) -> list[int]:
    """Steps with a usable ``metric``, best first; ties go to the later step."""
    ranked = [(value, step) for step, metrics in metrics_by_step.items()
              if (value := metric_value(metrics, metric)) is not None]
    sign = 1.0 if mode == "min" else -1.0
    ranked.sort(key=lambda item: (sign * item[0], -item[1]))
    steps = [step for _, step in ranked]
    return steps if count is None else steps[:count]


def steps_to_delete(metrics_by_step: Mapping[int, Mapping | None],
                    policy: RetentionPolicy) -> list[int]:
    """The committed steps ``policy`` drops, in increasing order.

    ``metrics_by_step`` maps every committed step to the metrics it was
    saved with (None or {} when it has none).
    """
    if policy.keeps_everything or not metrics_by_step:
        return []
    steps = sorted(metrics_by_step)
    kept = {steps[-1]}
    if policy.keep_last is not None:
        kept.update(steps[-policy.keep_last:])
    if policy.keep_every_steps is not None:
        kept.update(s for s in steps if s % policy.keep_every_steps == 0)
    if policy.keep_best is not None:
        kept.update(best_steps(metrics_by_step, policy.best_metric, policy.best_mode,
                               policy.keep_best))
    return [s for s in steps if s not in kept]
