"""A Gaussian classifier over features: one mean per target and one shared covariance (LDA).

HiDe-Prompt keeps a Gaussian per class and trains a classifier on features sampled from
them; with one covariance shared by all targets the Bayes classifier of those Gaussians is
linear and known in closed form, so this computes it directly. The statistics are sums
(a count and a feature sum per target, and ``Σ x xᵀ``): they accumulate experience by
experience, store no sample and do not depend on the order. Memory: d² + T x d numbers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from avalanche_color.routing.samples import check_samples
from avalanche_color.utils.precision import in_full_precision
from avalanche_color.utils.state import take_stored_shapes

# The covariance is shrunk towards a multiple of the identity: S + SHRINKAGE * trace(S) / d * I.
SHRINKAGE = 0.1


class GaussianClassifier(nn.Module):
    """Linear discriminant analysis in closed form: per-target means, one shared covariance.

    Args:
        in_features: d, the width of the input features.
    """

    counts: Tensor
    sums: Tensor
    second_moment: Tensor
    weight: Tensor
    bias: Tensor

    def __init__(self, in_features: int) -> None:
        super().__init__()
        self.register_buffer("counts", torch.zeros(0, dtype=torch.float64))
        self.register_buffer("sums", torch.zeros(0, in_features, dtype=torch.float64))
        self.register_buffer("second_moment", torch.zeros(in_features, in_features, dtype=torch.float64))
        self.register_buffer("weight", torch.zeros(in_features, 0))
        self.register_buffer("bias", torch.zeros(0))

    @property
    def num_targets(self) -> int:
        return self.weight.shape[1]

    @in_full_precision
    def forward(self, features: Tensor) -> Tensor:
        """Scores (n, T): the log-density of each target's Gaussian, up to a term shared by all, in
        float32 under any autocast (bfloat16 scores pick another target for a few percent of samples)."""
        return features.float() @ self.weight + self.bias

    @in_full_precision
    def add(self, features: Tensor, targets: Tensor) -> None:
        """Add these samples to the accumulated statistics (the classifier is not solved again)."""
        check_samples(features, targets)
        self.counts, self.sums, self.second_moment = self._with(features, targets)

    @torch.no_grad()
    @in_full_precision
    def fit(self, features: Tensor, targets: Tensor, *, keep: bool = True) -> None:
        """Solve the classifier over the accumulated statistics plus these samples.

        Args: as :meth:`~avalanche_color.routing.ridge.RandomFeatureRidge.fit`.
        """
        check_samples(features, targets)
        counts, sums, second_moment = self._with(features, targets)
        seen = counts > 0
        means = sums / counts.clamp(min=1)[:, None]
        # Within-target scatter: Σ x xᵀ minus each target's n μ μᵀ.
        scatter = second_moment - (sums[seen].T @ means[seen])
        degrees = max(float(counts.sum()) - int(seen.sum()), 1.0)
        covariance = scatter / degrees
        dim = covariance.shape[0]
        covariance = covariance + SHRINKAGE * max(float(torch.trace(covariance)) / dim, 1e-12) * torch.eye(
            dim, dtype=covariance.dtype, device=covariance.device)
        precision_means = torch.linalg.solve(covariance, means.T)  # (d, T)
        bias = -0.5 * (means.T * precision_means).sum(dim=0)
        bias[~seen] = float("-inf")  # a target without samples is never predicted
        self.weight, self.bias = precision_means.float(), bias.float()
        if keep:
            self.counts, self.sums, self.second_moment = counts, sums, second_moment

    def _with(self, features: Tensor, targets: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The accumulated statistics with these samples added (nothing stored).

        The per-target sums are a one-hot matmul, not ``index_add``: on CUDA ``index_add`` adds with
        atomics in no fixed order, so two ranks (or two runs) fitting the same samples would differ in
        the last bits; a matmul and a column sum give the same bits every time.
        """
        data = features.detach().to(self.sums.device, torch.float64)
        targets = targets.to(self.sums.device).long()
        count = max(len(self.counts), int(targets.max()) + 1)
        counts = nn.functional.pad(self.counts, (0, count - len(self.counts)))
        sums = nn.functional.pad(self.sums, (0, 0, 0, count - len(self.sums)))
        one_hot = nn.functional.one_hot(targets, count).to(torch.float64)  # (n, T)
        counts = counts + one_hot.sum(dim=0)
        sums = sums + one_hot.T @ data
        return counts, sums, self.second_moment + data.T @ data

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        take_stored_shapes(self, state_dict, prefix, ("counts", "sums", "weight", "bias"))
        super()._load_from_state_dict(state_dict, prefix, *args)
