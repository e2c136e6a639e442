"""Offline streams from scikit-learn's bundled digits, and a small ViT pretrained on held-out digits.

Nothing here downloads: ``sklearn.datasets.load_digits`` ships with scikit-learn
(1,797 grey 8x8 images of 0-9). The images are upsampled to 16 px and given 3
channels so that a timm ViT with 4 px patches takes them.

Split: 30% of the images (stratified, seeded) pretrain the backbone on the
plain domain. The other 70% are split 70/30 into the streams' train and test data:

* class-incremental: 5 experiences of 2 digits each (0-1, 2-3, ...);
* domain-incremental: the same 10 digits in 4 visibly different domains, one
  per experience: plain, inverted, rotated by 90 degrees, and tinted on noise.

The streams take any backbone: ``image_size``, ``mean``, ``std`` and ``interpolation`` (the
backbone's, :func:`~avalanche_color.backbone_data_config`) normalise the 16 px images and resize
them, when a sample is drawn, to the backbone's input side. The defaults are the bundled digits
ViT's (16 px, mean and std 0.5): its streams hold the normalised 16 px images themselves, with no
transform.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from avalanche.benchmarks import tensors_benchmark
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor, nn
from torchvision.transforms.v2 import functional

from avalanche_color.benchmarks.stream_building import DEFAULT_MEAN, DEFAULT_STD, generic_benchmark
from avalanche_color.benchmarks.transforms import _channel_values, _mode

IMAGE_SIZE = 16
NUM_CLASSES = 10
DOMAINS = ("plain", "inverted", "rotated", "tinted")


@dataclass(frozen=True)
class DigitsSplit:
    pretrain: tuple[Tensor, Tensor]
    train: tuple[Tensor, Tensor]
    test: tuple[Tensor, Tensor]


def digits_split(seed: int = 0) -> DigitsSplit:
    """The digits as (N, 3, 16, 16) images in [0, 1], split for pretraining and the streams."""
    from sklearn.datasets import load_digits  # here: scikit-learn takes a second to import
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = torch.as_tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    images = nn.functional.interpolate(images, size=IMAGE_SIZE, mode="bilinear", align_corners=False)
    images = images.expand(-1, 3, -1, -1).contiguous()
    labels = torch.as_tensor(digits.target, dtype=torch.long)
    index = torch.arange(len(labels))
    pretrain, rest = train_test_split(index, test_size=0.7, stratify=labels, random_state=seed)
    train, test = train_test_split(rest, test_size=0.3, stratify=labels[rest], random_state=seed)
    take = lambda i: (images[i], labels[i])  # noqa: E731
    return DigitsSplit(take(pretrain), take(train), take(test))


def normalise(images: Tensor, mean: Sequence[float] = DEFAULT_MEAN, std: Sequence[float] = DEFAULT_STD) -> Tensor:
    """[0, 1] images normalised per channel by ``mean`` and ``std`` (the default: centred around 0, as the digits
    backbone was pretrained)."""
    mean, std = _channel_values("mean", mean), _channel_values("std", std)
    if min(std) <= 0:
        raise ValueError(f"std must be positive for every channel, got {std}")
    if len(set(mean)) == 1 and len(set(std)) == 1:  # the same number for every channel, as the digits' own
        return (images - mean[0]) / std[0]
    return (images - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)


class Resized:
    """A (3, H, W) image resized to ``image_size`` px with ``interpolation`` (timm's name), when a sample is
    drawn: the streams keep their 16 px images, however large the backbone's input."""

    def __init__(self, image_size: int, interpolation: str = "bilinear") -> None:
        if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
            raise ValueError(f"image_size must be a positive int, got {image_size!r}")
        self.image_size, self.mode = image_size, _mode(interpolation)

    def __call__(self, image: Tensor) -> Tensor:
        return functional.resize(image, [self.image_size, self.image_size], interpolation=self.mode, antialias=True)


def _benchmark(train: list, test: list, task_labels: bool, image_size: int, interpolation: str):
    """The stream of (normalised 16 px images, labels) per experience, resized to ``image_size`` on the fly."""
    labels = list(range(len(train))) if task_labels else [0] * len(train)
    if image_size == IMAGE_SIZE:  # the digits backbone's own size: the tensors as they are
        return tensors_benchmark(train, test, task_labels=labels)
    resize = Resized(image_size, interpolation)
    return generic_benchmark(tensors_benchmark, train, test, task_labels=labels, train_transform=resize,
                             eval_transform=resize)


def in_domain(images: Tensor, domain: str, seed: int) -> Tensor:
    """The images as seen in ``domain`` (still in [0, 1])."""
    if domain == "plain":
        return images
    if domain == "inverted":
        return 1.0 - images
    if domain == "rotated":
        return images.rot90(1, dims=(-2, -1))
    if domain == "tinted":
        generator = torch.Generator().manual_seed(seed)
        tint = torch.tensor([1.0, 0.35, 0.1]).view(1, 3, 1, 1)
        noise = 0.35 * torch.rand(images.shape, generator=generator)
        return (images * tint + noise * (1 - images)).clamp(0, 1)
    raise ValueError(f"domain must be one of {DOMAINS}, got {domain!r}")


def class_incremental_stream(split: DigitsSplit, classes_per_experience: int = 2, task_labels: bool = False, *,
                             image_size: int = IMAGE_SIZE, mean: Sequence[float] = DEFAULT_MEAN,
                             std: Sequence[float] = DEFAULT_STD, interpolation: str = "bilinear"):
    """Disjoint digit pairs per experience; task label 0 throughout, or the experience's index.

    ``image_size``, ``mean``, ``std``, ``interpolation``: the backbone's input side and preprocessing
    (default: the digits backbone's, 16 px, 0.5 and 0.5).
    """
    train, test = [], []
    for first in range(0, NUM_CLASSES, classes_per_experience):
        classes = torch.arange(first, first + classes_per_experience)
        for (images, labels), store in ((split.train, train), (split.test, test)):
            keep = torch.isin(labels, classes)
            store.append((normalise(images[keep], mean, std), labels[keep]))
    return _benchmark(train, test, task_labels, image_size, interpolation)


def domain_incremental_stream(split: DigitsSplit, domains: tuple[str, ...] = DOMAINS, task_labels: bool = False, *,
                              image_size: int = IMAGE_SIZE, mean: Sequence[float] = DEFAULT_MEAN,
                              std: Sequence[float] = DEFAULT_STD, interpolation: str = "bilinear"):
    """All ten digits in every experience, one domain each; the train and test images differ.

    Task label 0 throughout, or the experience's index with ``task_labels=True``. ``image_size``, ``mean``,
    ``std``, ``interpolation``: as :func:`class_incremental_stream`'s. A domain is drawn at 16 px, then resized.
    """
    train, test = [], []
    for index, domain in enumerate(domains):
        for (images, labels), store, salt in ((split.train, train, 0), (split.test, test, 1)):
            store.append((normalise(in_domain(images, domain, seed=2 * index + salt), mean, std), labels))
    return _benchmark(train, test, task_labels, image_size, interpolation)


# timm's vit_tiny architecture resized: 4 blocks, width 64, 4 heads, 4 px patches on 16 px images.
DIGITS_VIT = {"architecture": "vit_tiny_patch16_224",
              "model_kwargs": dict(img_size=IMAGE_SIZE, patch_size=4, embed_dim=64, depth=4, num_heads=4)}


def small_vit(num_classes: int = 0, seed: int = 0) -> VisionTransformer:
    """A 4-block, 64-wide ViT on 16 px images with 4 px patches (about 0.2 M parameters)."""
    torch.manual_seed(seed)
    return VisionTransformer(**DIGITS_VIT["model_kwargs"], num_classes=num_classes)


def pretrained_vit(split: DigitsSplit, *, epochs: int = 60, seed: int = 0,
                   log: Callable[[str], None] = print) -> dict[str, Tensor]:
    """Weights of :func:`small_vit` (without its head) pretrained on the held-out plain digits.

    The main job loads the committed result (``load_backbone("digits")``); this runs only when
    asked (the repository's ``python -m benchmarks.pretraining.digits``).
    """
    model = small_vit(NUM_CLASSES, seed)
    images, labels = normalise(split.pretrain[0]), split.pretrain[1]
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
    generator = torch.Generator().manual_seed(seed)
    for epoch in range(epochs):
        model.train()
        for batch in torch.randperm(len(labels), generator=generator).split(64):
            loss = nn.functional.cross_entropy(model(images[batch]), labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        schedule.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(normalise(split.test[0])).argmax(1) == split.test[1]).float().mean()
    log(f"pretrained the backbone on {len(labels)} held-out digits for {epochs} epochs: "
        f"accuracy {accuracy:.3f} on the plain test digits")
    return {k: v for k, v in model.state_dict().items() if not k.startswith("head.")}
