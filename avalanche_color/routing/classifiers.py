"""The closed-form classifiers over features that the class routers fit (and RanPAC, a baseline):
:class:`RandomFeatureRidge` (RanPAC's ridge over random ReLU features) and :class:`GaussianClassifier`
(one mean per target and one shared covariance, LDA). Both accumulate sums over samples, experience by
experience, store no sample and do not depend on the order the data came in.

They, the routers and k-means compute in full precision whatever ``torch.autocast`` a caller runs under
(:func:`~avalanche_color.utils.precision.full_precision`): under ``torch.autocast(bfloat16)`` a matmul or ``cdist`` computes in bfloat16 (8
bits of mantissa), and a nearest-prototype distance, a ridge readout or a Gaussian score then picks another
expert for a few percent of samples.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor, nn

from avalanche_color.utils.precision import in_full_precision
from avalanche_color.utils.state import take_stored_shapes

def check_samples(features: Tensor, targets: Tensor) -> None:
    """Refuse features and targets of different or zero length, and negative targets."""
    if features.shape[0] != targets.shape[0] or features.shape[0] == 0:
        raise ValueError(f"features and targets must have the same, non-zero length, got "
                         f"{features.shape[0]} and {targets.shape[0]}")
    if int(targets.min()) < 0:
        raise ValueError(f"targets must be non-negative, got {int(targets.min())}")


# --------------------------------------------------------------------------------------------------
# Closed-form ridge regression over fixed random ReLU features (the classifier of RanPAC).
#
# A feature ``f`` (d) is expanded to ``h = relu(f P)`` with a fixed Gaussian projection ``P``
# (d x M). The readout ``W`` (M x T) minimises ``||H W - Y||² + λ ||W||²`` over every sample
# seen, ``Y`` holding one-hot targets, so ``W = (G + λ I)⁻¹ Q`` with ``G = Σ hᵀh`` and
# ``Q = Σ hᵀy``. Both are sums over samples: they accumulate experience by experience, store
# no sample, and do not depend on the order the data came in. Memory: ``G`` is M² float64
# numbers, ``Q`` and ``W`` M x T, whatever the number of samples.
#
# λ is chosen per fit, as RanPAC does, on a held-out split of the data being added: the
# readout is solved on everything else for each λ of a grid, and the λ with the best
# held-out accuracy wins (ties: the larger). The grid is relative to the mean eigenvalue of
# ``G`` (``trace(G) / M``), so it fits any feature scale and any amount of data.

# λ / (trace(G) / M) candidates.
RELATIVE_RIDGE_GRID: tuple[float, ...] = tuple(10.0 ** e for e in range(-6, 3))
HOLDOUT_FRACTION = 0.2
HOLDOUT_SEED = 0


class RandomFeatureRidge(nn.Module):
    """Ridge regression onto one-hot targets over fixed random ReLU features, fitted in closed form.

    Args:
        in_features: d, the width of the input features.
        width: M, the number of random features (RanPAC: 10,000 for ViT-B's 768).
        seed: seed of the random projection.
        ridge: a fixed λ; None chooses one on a held-out split at every :meth:`fit`.
    """

    projection: Tensor
    gram: Tensor
    moments: Tensor
    readout: Tensor
    ridge: Tensor

    def __init__(self, in_features: int, width: int = 4096, *, seed: int = 0, ridge: Optional[float] = None) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.fixed_ridge = ridge
        self.register_buffer("projection", torch.randn(in_features, width, generator=generator))
        self.register_buffer("gram", torch.zeros(width, width, dtype=torch.float64))
        self.register_buffer("moments", torch.zeros(width, 0, dtype=torch.float64))
        self.register_buffer("readout", torch.zeros(width, 0))
        self.register_buffer("ridge", torch.tensor(float("nan"), dtype=torch.float64))

    @property
    def width(self) -> int:
        return self.projection.shape[1]

    @property
    def num_targets(self) -> int:
        """T, the number of targets the readout scores (one past the largest target fitted)."""
        return self.readout.shape[1]

    @in_full_precision
    def expand(self, features: Tensor) -> Tensor:
        """The random features ``relu(f P)``, (n, M), in float32 (under any autocast)."""
        return torch.relu(features.float() @ self.projection)

    @in_full_precision
    def forward(self, features: Tensor) -> Tensor:
        """Scores (n, T) of every target for each feature row, in float32 under any autocast."""
        return self.expand(features) @ self.readout

    def statistics(self, features: Tensor, targets: Tensor, num_targets: int) -> tuple[Tensor, Tensor]:
        """``(Σ hᵀh, Σ hᵀy)`` of these samples, in float64."""
        expanded = self.expand(features).double()
        one_hot = nn.functional.one_hot(targets.long(), num_targets).double()
        return expanded.T @ expanded, expanded.T @ one_hot

    @in_full_precision
    def add(self, features: Tensor, targets: Tensor) -> None:
        """Add these samples to the accumulated statistics (the readout is not solved again)."""
        check_samples(features, targets)
        gram, moments = self._with(features, targets)
        self.gram, self.moments = gram, moments

    @torch.no_grad()
    @in_full_precision
    def fit(self, features: Tensor, targets: Tensor, *, keep: bool = True) -> None:
        """Solve the readout over the accumulated statistics plus these samples.

        Args:
            features: (n, d) features.
            targets: (n,) target indices (>= 0); the readout grows to cover the largest.
            keep: add the samples to the accumulated statistics; without it the readout
                includes them but a later fit does not (:meth:`add` them when they are final).
        """
        check_samples(features, targets)
        gram, moments = self._with(features, targets)
        ridge = self.fixed_ridge
        if ridge is None:
            ridge = self.choose_relative_ridge(features, targets) * mean_eigenvalue(gram)
        self.readout = solve_ridge(gram, moments, ridge).to(self.readout.dtype)
        self.ridge = torch.tensor(float(ridge), dtype=torch.float64, device=self.ridge.device)
        if keep:
            self.gram, self.moments = gram, moments

    def choose_relative_ridge(self, features: Tensor, targets: Tensor) -> float:
        """The grid value with the best held-out accuracy on a seeded split of these samples."""
        holdout = int(round(HOLDOUT_FRACTION * features.shape[0]))
        if holdout == 0 or holdout == features.shape[0]:  # too few samples to hold any out
            return RELATIVE_RIDGE_GRID[len(RELATIVE_RIDGE_GRID) // 2]
        order = torch.randperm(features.shape[0], generator=torch.Generator().manual_seed(HOLDOUT_SEED))
        held, rest = order[:holdout].to(features.device), order[holdout:].to(features.device)
        gram, moments = self._with(features[rest], targets[rest], num_targets=int(targets.max()) + 1)
        eigenvalues, eigenvectors = torch.linalg.eigh(gram)
        rotated = eigenvectors.T @ moments  # one eigendecomposition serves every λ
        held_expanded = self.expand(features[held]).double() @ eigenvectors
        scale = float(eigenvalues.clamp(min=0).mean())
        best, best_accuracy = RELATIVE_RIDGE_GRID[0], -1.0
        for relative in RELATIVE_RIDGE_GRID:
            scores = held_expanded @ (rotated / (eigenvalues.clamp(min=0) + relative * scale)[:, None])
            accuracy = float((scores.argmax(dim=1) == targets[held]).double().mean())
            if accuracy >= best_accuracy:  # ties: the larger λ
                best, best_accuracy = relative, accuracy
        return best

    def _with(self, features: Tensor, targets: Tensor, num_targets: Optional[int] = None) -> tuple[Tensor, Tensor]:
        """The accumulated statistics with these samples added (nothing stored)."""
        count = max(self.num_targets, self.moments.shape[1], int(targets.max()) + 1, num_targets or 0)
        gram, moments = self.statistics(features.to(self.projection.device), targets.to(self.projection.device), count)
        accumulated = nn.functional.pad(self.moments, (0, count - self.moments.shape[1]))
        return self.gram + gram, accumulated + moments

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        take_stored_shapes(self, state_dict, prefix, ("moments", "readout"))
        super()._load_from_state_dict(state_dict, prefix, *args)


def mean_eigenvalue(gram: Tensor) -> float:
    """``trace(G) / M``: the scale λ is relative to (1 for an empty G, so λ stays positive)."""
    scale = float(torch.diagonal(gram).mean())
    return scale if scale > 0 else 1.0


def solve_ridge(gram: Tensor, moments: Tensor, ridge: float) -> Tensor:
    """``(G + λ I)⁻¹ Q`` in float64 (G + λI is symmetric positive definite for λ > 0)."""
    if not ridge > 0:
        raise ValueError(f"ridge must be > 0, got {ridge!r}")
    system = gram + ridge * torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
    return torch.cholesky_solve(moments, torch.linalg.cholesky(system))


# --------------------------------------------------------------------------------------------------
# A Gaussian classifier over features: one mean per target and one shared covariance (LDA).
#
# HiDe-Prompt keeps a Gaussian per class and trains a classifier on features sampled from
# them; with one covariance shared by all targets the Bayes classifier of those Gaussians is
# linear and known in closed form, so this computes it directly. The statistics are sums
# (a count and a feature sum per target, and ``Σ x xᵀ``): they accumulate experience by
# experience, store no sample and do not depend on the order. Memory: d² + T x d numbers.

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

        Args: as :meth:`RandomFeatureRidge.fit`.
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
