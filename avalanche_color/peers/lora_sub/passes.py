"""The two no-gradient passes of LoRA subtraction over one experience's whole training data (an online
chunk's whole experience), in eval mode, the random generators left as they were:

* before experience t > 0, with its training transforms, through the subtracted network: each block's
  input covariance (the code's ``get_cur_x`` pass over the training loader);
* after it, with its eval transforms, through the trained network: its classes' mean features (the
  code's ``_build_protos`` over each class's training images in ``mode='test'``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from avalanche.benchmarks.utils.data_loader import collate_from_data_or_kwargs
from torch import Tensor, nn

from avalanche_color.peers.lora_sum.covariances import input_covariances
from avalanche_color.peers.lora_sub.prototypes import class_means
from avalanche_color.training.loaders import data_loader, loader_options
from avalanche_color.utils.experiences import origin_experience
from avalanche_color.utils.rng import generators_untouched


def experience_batches(strategy: Any, train: bool, **kwargs: Any) -> Iterator[tuple[Tensor, Tensor]]:
    """``(images, labels)`` of the strategy's experience, with its training or eval transforms, in order
    (batches of ``eval_mb_size``, the strategy's loader options)."""
    dataset = origin_experience(strategy.experience).dataset
    dataset = dataset.train() if train else dataset.eval()
    collate: dict[str, Any] = {}
    collate_from_data_or_kwargs(dataset, collate)
    loader = data_loader(dataset, loader_options(kwargs, strategy.config), strategy.device,
                         batch_size=strategy.eval_mb_size, **collate)
    for batch in loader:
        yield batch[0].to(strategy.device), batch[1].to(strategy.device)


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode, no gradients, the random generators untouched; its mode restored after."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), generators_untouched():
            yield
    finally:
        model.train(was_training)


def subtracted_covariances(strategy: Any, **kwargs: Any) -> list[Tensor]:
    """Each adapted layer's mean ``x x^T`` (float64) over the experience's training data through the
    subtracted network (:meth:`~avalanche_color.peers.lora_sub.model.LoRASubtractionViT.subtracted_mixing`)."""
    model = strategy.model
    mixing = model.subtracted_mixing()
    with evaluating(model), input_covariances(model.layers) as sums:
        for images, _ in experience_batches(strategy, train=True, **kwargs):
            model.features(images, mixing)
    return [total.mean() for total in sums]


def experience_class_means(strategy: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
    """``(classes, means)``: each class of the experience and its mean feature (float64) under the
    trained network, eval transforms, under the strategy's autocast (as its evaluation)."""
    model = strategy.model
    with evaluating(model), strategy.autocast():
        return class_means((model.features(images), labels)
                           for images, labels in experience_batches(strategy, train=False, **kwargs))
