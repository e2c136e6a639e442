"""The options a checkpoint records, and the check that refuses a resume under options that change the run."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any, Optional

from avalanche_color.training.checkpoint import Checkpoint, CheckpointError
from avalanche_color.utils.files import PathLike

if TYPE_CHECKING:
    from avalanche.training.templates import SupervisedTemplate

# Options that may differ on resume: they decide how data is loaded and evaluated, not what is learned.
OPTIONS_FREE_ON_RESUME = frozenset({"num_workers", "pin_memory", "persistent_workers", "eval_mb_size",
                                    "eval_every", "cache_evaluation", "check_data", "prototype_batch_size"})


def recorded_options(strategy: "SupervisedTemplate") -> Optional[dict[str, Any]]:
    """Every option of ``strategy``'s config as JSON values (None for a strategy without one)."""
    config = getattr(strategy, "config", None)
    as_dict = getattr(config, "as_dict", None)
    return None if as_dict is None else json.loads(json.dumps(as_dict()))


def changed_options(saved: Optional[Mapping[str, Any]], current: Optional[Mapping[str, Any]],
                    allow_changed: Collection[str] = ()) -> list[str]:
    """Each option that differs between a checkpoint's ``saved`` options and the strategy's ``current``
    ones, as ``"name: checkpoint .., strategy .."``, leaving out :data:`OPTIONS_FREE_ON_RESUME` and
    ``allow_changed`` (nothing when either side recorded no options)."""
    if saved is None or current is None:
        return []
    free = OPTIONS_FREE_ON_RESUME | set(allow_changed)
    return [f"{name}: checkpoint {saved.get(name)!r}, strategy {current.get(name)!r}"
            for name in sorted(set(saved) | set(current))
            if name not in free and saved.get(name) != current.get(name)]


def check_same_options(checkpoint: Checkpoint, strategy: "SupervisedTemplate", path: PathLike,
                       allow_changed: Collection[str] = ()) -> None:
    """Refuse to resume ``strategy`` from ``checkpoint`` written under other options, naming each."""
    if isinstance(allow_changed, str):
        raise ValueError(f"allow_changed must be a list of option names, got the string {allow_changed!r}; "
                         f"write allow_changed=[{allow_changed!r}]")
    current = recorded_options(strategy)
    if current is not None:
        unknown = sorted(set(allow_changed) - set(current))
        if unknown:
            raise ValueError(f"allow_changed names options this strategy does not have: {unknown}; "
                             f"its options are {sorted(current)}")
    problems = changed_options(checkpoint.options, current, allow_changed)
    if problems:
        names = [problem.partition(":")[0] for problem in problems]
        raise CheckpointError(
            f"checkpoint {path} was written by a run with other options: {'; '.join(problems)}. Resuming would "
            f"label the old run's results with the new options. Give the strategy the checkpoint's values, start "
            f"over (resume=False or another checkpoint path), or continue with the new values anyway: "
            f"train_stream(..., allow_changed={names!r})")
