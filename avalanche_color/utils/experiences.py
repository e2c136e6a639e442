"""What an Avalanche experience says about itself, whichever generator made it.

The older generators (``nc_benchmark``, ``ni_benchmark``, ``tensors_benchmark``, ...)
give experiences ``classes_in_this_experience`` and ``task_labels``. Those of
``benchmark_from_datasets``, ``class_incremental_benchmark``,
``new_instances_benchmark``, ``task_incremental_benchmark`` and
``benchmark_with_validation_stream`` may have neither; their dataset's targets
(and task labels, if any) are always there. Avalanche's online scenario cuts
experiences into chunks; the helpers at the end say which experience a chunk belongs to.
"""

from __future__ import annotations

from typing import Any

from avalanche.benchmarks.scenarios.online import OnlineCLExperience


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


# ------------------------------------------------------------------ online streams
# Avalanche's online scenario (split_online_stream, OnlineCLScenario) cuts each experience
# into chunks (OnlineCLExperience). With access_task_boundaries=True a chunk names its
# origin experience, and Avalanche adapts the model to that origin experience at its first
# chunk only (BatchObservation.check_model_and_optimizer); without, a chunk is all there is.


def is_online_chunk(experience: Any) -> bool:
    """Whether ``experience`` is a chunk of an experience, from Avalanche's online scenario."""
    return isinstance(experience, OnlineCLExperience)


def origin_experience(experience: Any) -> Any:
    """The experience one expert learns: a chunk's origin experience (online, with task
    boundaries), else ``experience`` itself."""
    if is_online_chunk(experience) and experience.access_task_boundaries:
        return experience.origin_experience
    return experience


def continues_experience(experience: Any) -> bool:
    """Whether ``experience`` is a further chunk of the experience the previous chunk began."""
    return is_online_chunk(experience) and experience.access_task_boundaries and not experience.is_first_subexp


def ends_experience(experience: Any, seen_samples: int) -> bool:
    """Whether ``experience`` completes its origin experience, given the samples of its chunks so far.

    Counted as well as read from ``is_last_subexp``: Avalanche 0.6.0 leaves that flag False on
    every chunk when an experience's size is a multiple of the chunk size.
    """
    if not is_online_chunk(experience) or not experience.access_task_boundaries:
        return True
    return bool(experience.is_last_subexp) or seen_samples >= len(experience.origin_experience.dataset)


def refuse_chunks_without_boundaries(experience: Any, who: str) -> None:
    """Refuse a chunk of an online stream built without task boundaries: ``who`` would make
    one expert per chunk of a few samples, and could never tell which chunks belong together."""
    if is_online_chunk(experience) and not experience.access_task_boundaries:
        raise ValueError(
            f"{who} trains one expert per experience, and experience {experience.current_experience} is a "
            f"chunk of {len(experience.dataset)} samples of an online stream without task boundaries "
            f"(access_task_boundaries=False); build the stream with split_online_stream(..., "
            f"access_task_boundaries=True) (or OnlineCLScenario(..., access_task_boundaries=True)), so that "
            f"one expert learns all chunks of each experience"
        )
