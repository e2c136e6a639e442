"""Avalanche's model adaptation for a routed expert model: which expert an experience gets.

Avalanche calls ``model.adaptation(experience)`` before training on an experience and before
evaluating one. A routed model records the classes it has seen (its output width) and, for a
training experience, starts a new expert, or continues the unfinished one of the same experience.
"""

from __future__ import annotations

from typing import Any

from avalanche_color.experts.backbone import check_experience_images
from avalanche_color.utils.experiences import (experience_classes, experience_task_labels,
                                                  refuse_chunks_without_boundaries)


def adapt_to_experience(model: Any, experience: Any) -> None:
    """A new expert for each training experience of ``model`` (a RoutedExpertViT, in train mode;
    typed loosely so that this module, which the model imports, never imports the model).

    Training on an experience again (a revisit) adds a further expert; only an unfinished
    expert of the same experience (a run resumed inside it, or the next chunk of an online
    stream with task boundaries) is continued. With ``router="oracle"`` an experience must
    have one task label, which no other experience has.
    """
    classes, tasks = experience_classes(experience), experience_task_labels(experience)
    if classes:  # MultiTaskModule's bookkeeping, for experiences of any generator
        model.max_class_label = max(model.max_class_label, classes[-1] + 1)
    if not model.training:
        return
    refuse_chunks_without_boundaries(experience, type(model).__name__)
    model.known_train_tasks_labels = model.known_train_tasks_labels | set(tasks)
    experience_id = int(experience.current_experience)
    if model.bank.current_expert(experience_id) is not None:
        return
    # Refuse unusable data before the expert exists, not at the first forward.
    check_experience_images(model.backbone, experience)
    if not model.router.uses_features:
        if len(tasks) != 1:
            raise ValueError(f"router='oracle' routes by task label, so experience {experience_id} must "
                             f"have one task label, got {tasks}")
        model.bank.check_distinct_task(tasks[0], experience_id)
    model.start_expert(classes, experience_id, tasks[0])
