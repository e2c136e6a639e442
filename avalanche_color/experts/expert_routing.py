"""ExpertRouting: how a routed expert model picks each sample's expert (routing features, the router, the
evaluation cache), mixed into :class:`~avalanche_color.experts.routed_vit.RoutedExpertViT`.

It uses the model's ``config``, ``features``, ``bank``, ``router``, ``eval_cache``, ``num_experts``,
``num_classes`` and ``predict``.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from avalanche_color.routing.eval_cache import image_keys
from avalanche_color.utils.host_values import host_value


class ExpertRouting:
    """The routing half of :class:`~avalanche_color.experts.routed_vit.RoutedExpertViT`."""

    def routing_features(self, x: Tensor) -> Tensor:
        """The features the router is fitted on and routes by: the backbone's, or with the first expert."""
        if self.config.routing_features == "first_expert":
            if not self.num_experts:
                raise RuntimeError("routing_features='first_expert' needs a trained first expert")
            features = self.features(x, 0, trained=self.bank.trainable)
        else:
            features = self.features(x)
        return nn.functional.normalize(features, dim=-1) if self.config.normalize_features else features

    def routing_features_frozen(self) -> bool:
        """Whether routing features stay the same for the rest of the run."""
        return self.config.routing_features == "backbone" or bool(self.num_experts and self.bank.finished[0])

    def route(self, x: Tensor, task_labels: Optional[Tensor] = None, keys: Optional[list[bytes]] = None) -> Tensor:
        """The expert index of each sample, chosen by the router. ``keys`` (the images' content hashes)
        let the evaluation cache supply routing features it computed before, while they are frozen."""
        if task_labels is not None:
            task_labels = torch.as_tensor(task_labels, device=x.device).expand(x.shape[0])
        features = None
        if self.router.uses_features:
            if keys is not None and self.eval_cache is not None and self.routing_features_frozen():
                features = self.eval_cache.routing_features(x, keys, self.routing_features)
            else:
                features = self.routing_features(x)
        return self.router(features, task_labels, self.bank.tasks)

    def route_and_predict(self, x: Tensor, task_labels: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor]]:
        """The routed prediction of an eval-mode ``model(x)``, in either mode: the logits and each sample's
        expert (None while there is no expert). With ``cache_evaluation=True``, routing features and finished
        experts' logits of images seen before are reused: the same values, computed without gradients."""
        if not self.num_experts:
            return x.new_zeros(x.shape[0], self.num_classes), None
        if self.eval_cache is None:
            experts = self.route(x, task_labels)
            return self.predict(x, experts), experts
        with torch.no_grad():
            keys = image_keys(x)
            experts = self.route(x, task_labels, keys)
            finished = host_value(self.bank, "finished", self.bank.finished, lambda tensor: tensor.tolist())
            return self.eval_cache.predict(x, keys, experts, self.num_classes, self.predict,
                                           lambda expert: finished[expert]), experts
