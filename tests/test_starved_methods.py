"""The diagnosis script's feature probe reads what each kind of model's head reads."""

from __future__ import annotations

import torch
from avalanche.models import IncrementalClassifier
from avalanche.models.utils import FeatureExtractorModel

from benchmarks.investigations.starved_methods import adapted_features
from streams import IMAGE_SIZE, tiny_vit


def images(n: int = 4) -> torch.Tensor:
    return torch.randn(n, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(1))


def test_a_fine_tuned_timm_vit_gives_its_heads_input():
    vit = tiny_vit(num_classes=5).eval()  # Naive, EWC, LwF, Replay: the timm ViT with its own head
    x = images()
    features = adapted_features(vit, x)
    assert features.shape == (len(x), vit.num_features)
    torch.testing.assert_close(vit.head(features), vit(x))


def test_ft_masked_gives_the_features_its_incremental_head_reads():
    vit = tiny_vit()
    head = IncrementalClassifier(vit.num_features, 5)
    model = FeatureExtractorModel(vit, head).eval()  # FT-masked's model; its .features is a tensor attribute
    x = images()
    features = adapted_features(model, x)
    torch.testing.assert_close(head(features), model(x))
