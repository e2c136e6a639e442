"""Tiny seeded ViTs and synthetic streams for the tests (CPU, seconds)."""

from __future__ import annotations

import torch
from avalanche.benchmarks import tensors_benchmark
from timm.models.vision_transformer import VisionTransformer

IMAGE_SIZE = 16


def tiny_vit(seed: int = 0, **overrides) -> VisionTransformer:
    """A 2-block, 32-wide ViT on 16 px images: small enough for seconds on CPU."""
    torch.manual_seed(seed)
    options = dict(img_size=IMAGE_SIZE, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=0)
    options.update(overrides)
    return VisionTransformer(**options)


def class_templates(num_classes: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(num_classes, 3, IMAGE_SIZE, IMAGE_SIZE, generator=generator)


def noisy_copies(templates: torch.Tensor, labels: torch.Tensor, noise: float, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return templates[labels] + noise * torch.randn(len(labels), *templates.shape[1:], generator=generator)


def domain_stream(num_domains: int = 2, num_classes: int = 3, per_class: int = 20, *,
                  shift: float = 1.5, task_labels: bool = False, seed: int = 0):
    """Domain-incremental: the same classes in domains far apart (a large per-domain offset).

    Domain d shows class c's pattern under label (c + d) % num_classes, so one
    model for all domains must contradict itself: fine-tuning forgets, routing does not.
    """
    templates = class_templates(num_classes, seed)
    train, test = [], []
    for domain in range(num_domains):
        offset = shift * torch.randn(3, 1, 1, generator=torch.Generator().manual_seed(seed + 100 + domain))
        for split, store in ((0, train), (1, test)):
            patterns = torch.arange(num_classes).repeat_interleave(per_class)
            images = noisy_copies(templates, patterns, 0.3, seed + 10 * domain + split) + offset
            labels = (patterns + domain) % num_classes
            store.append((images, labels))
    return tensors_benchmark(train, test, task_labels=_task_labels(num_domains, task_labels))


def class_stream(num_experiences: int = 2, classes_per_experience: int = 2, per_class: int = 20, *,
                 task_labels: bool = False, seed: int = 0):
    """Class-incremental: disjoint classes per experience, each class a noisy template."""
    num_classes = num_experiences * classes_per_experience
    templates = 2.0 * class_templates(num_classes, seed)
    train, test = [], []
    for experience in range(num_experiences):
        classes = torch.arange(classes_per_experience) + experience * classes_per_experience
        labels = classes.repeat_interleave(per_class)
        for split, store in ((0, train), (1, test)):
            store.append((noisy_copies(templates, labels, 0.5, seed + 10 * experience + split), labels))
    return tensors_benchmark(train, test, task_labels=_task_labels(num_experiences, task_labels))


def _task_labels(count: int, distinct: bool) -> list[int]:
    return list(range(count)) if distinct else [0] * count
