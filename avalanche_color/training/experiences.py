"""What an Avalanche experience says about itself, whichever generator made it.

The older generators (``nc_benchmark``, ``ni_benchmark``, ``tensors_benchmark``, ...)
give experiences ``classes_in_this_experience`` and ``task_labels``. Those of
``benchmark_from_datasets``, ``class_incremental_benchmark``,
``new_instances_benchmark``, ``task_incremental_benchmark`` and
``benchmark_with_validation_stream`` may have neither; their dataset's targets
(and task labels, if any) are always there.
"""

from __future__ import annotations

from typing import Any


def experience_classes(experience: Any) -> list[int]:
    """The classes of ``experience``: as declared, else those of its dataset's targets."""
    declared = getattr(experience, "classes_in_this_experience", None)
    if declared is not None:
        return sorted(int(c) for c in declared)
    return _uniques(experience.dataset, "targets")


def experience_task_labels(experience: Any) -> list[int]:
    """The task labels of ``experience``: as declared, else its dataset's, else ``[0]`` (one task)."""
    declared = getattr(experience, "task_labels", None)
    if declared is not None:
        return sorted({int(t) for t in declared})
    return _uniques(experience.dataset, "targets_task_labels") or [0]


def _uniques(dataset: Any, attribute: str) -> list[int]:
    values = getattr(dataset, attribute, None)
    if values is None:
        return []
    uniques = getattr(values, "uniques", None)  # Avalanche's DataAttribute keeps them
    return sorted(int(v) for v in (uniques if uniques is not None else set(values)))
