"""What the table's model-level rows time: the sizes every section shares, a CoLoR model with trained-looking
experts, peft's counterpart, the class routers, and a training data loader over JPEG images made in memory
(the strategies the training, evaluation and memory rows run: :mod:`benchmarks.perf.strategies`)."""

from __future__ import annotations

import io
from typing import Any, Callable, Sequence

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from avalanche_color import CoLoRConfig, ExpertViT
from avalanche_color.routing.routers import ClassRouter

CLASSES = 10  # per expert
CLASS_ROUTERS = ("ridge", "gaussian")
ROUTER_WIDTH = CoLoRConfig().router_width  # the default M


def build_color(vit: nn.Module, experts: int, rank: int, classes: int, k: int, device: torch.device) -> ExpertViT:
    """``experts`` experts of ``classes`` classes each, with non-zero B and random prototypes."""
    model = ExpertViT(vit, rank=rank)
    generator = torch.Generator().manual_seed(0)
    for expert in range(experts):
        model.start_expert(list(range(expert * classes, (expert + 1) * classes)), experience=expert)
        with torch.no_grad():  # as if trained: B != 0, so the LoRA path does real work
            for layer in model.qkv_layers:
                layer.experts[expert].B.normal_(0, 0.02, generator=generator)
        centres = torch.nn.functional.normalize(torch.randn(k, model.num_features, generator=generator), dim=-1)
        model.router.set_prototypes(expert, centres)
    return model.to(device)


def peft_adapters(vit: nn.Module, adapters: int, rank: int) -> nn.Module:
    """The same ViT with ``adapters`` peft LoRA adapters (``expert0``, ...) on every fused qkv.

    ``target_modules=["qkv"]`` matches each block's ``attn.qkv`` linear layer, so peft
    adapts q, k and v (it cannot leave k out of a fused layer): A is r x d, B is 3d x r.
    Scaling 1, as ours (alpha = rank); random B, so the adapters do real work.
    """
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=["qkv"], lora_dropout=0.0, init_lora_weights=False)
    model = get_peft_model(vit, config, adapter_name="expert0")
    for adapter in range(1, adapters):
        model.add_adapter(f"expert{adapter}", config)
    adapted = [name for name, module in model.named_modules()
               if name.endswith("attn.qkv") and hasattr(module, "lora_A")]
    if len(adapted) != len(vit.blocks):
        raise RuntimeError(f"peft adapted {len(adapted)} qkv layers, the ViT has {len(vit.blocks)} blocks")
    return model.eval()


# A typical photo of ImageNet or DomainNet (width, height); CIFAR's 32 px and CORe50's 128 px decode faster.
PHOTO_SIZE = (500, 375)
PHOTOS = 64  # distinct JPEGs the loader cycles over


def jpeg_photos(count: int, size: tuple[int, int] = PHOTO_SIZE, seed: int = 0) -> list[bytes]:
    """``count`` photo-like JPEGs (smooth colour fields with grain, quality 90), encoded in memory.

    Pure noise would decode more slowly than photos, flat colour faster; this sits between.
    """
    generator = np.random.default_rng(seed)
    width, height = size
    photos = []
    for _ in range(count):
        coarse = Image.fromarray(generator.integers(0, 256, (height // 32, width // 32, 3), dtype=np.uint8))
        smooth = np.asarray(coarse.resize(size, Image.BICUBIC), dtype=np.int16)
        grain = generator.integers(-12, 13, smooth.shape, dtype=np.int16)
        buffer = io.BytesIO()
        Image.fromarray(np.clip(smooth + grain, 0, 255).astype(np.uint8)).save(buffer, format="JPEG", quality=90)
        photos.append(buffer.getvalue())
    return photos


def paper_train_transform(image_size: int, mean: Sequence[float], std: Sequence[float]) -> v2.Compose:
    """S-Prompts' training pipeline, which the paper adopts: RandomResizedCrop, flip, the backbone's normalisation."""
    return v2.Compose([v2.RandomResizedCrop(image_size, antialias=True), v2.RandomHorizontalFlip(), v2.PILToTensor(),
                       v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std)), v2.ToPureTensor()])


class JPEGDataset(Dataset):
    """``length`` samples cycling over encoded photos; each is decoded and transformed when loaded."""

    def __init__(self, photos: list[bytes], length: int, transform: Callable[[Image.Image], torch.Tensor],
                 classes: int) -> None:
        self.photos, self.length, self.transform, self.classes = photos, length, transform, classes

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = Image.open(io.BytesIO(self.photos[index % len(self.photos)])).convert("RGB")
        return self.transform(image), index % self.classes


def training_loader(dataset: Dataset, batch_size: int, workers: int, device: torch.device) -> DataLoader:
    """A shuffling loader as a training run would use: ``workers`` processes kept between epochs,
    pinned memory for CUDA."""
    options: dict[str, Any] = dict(num_workers=workers, persistent_workers=workers > 0)
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, pin_memory=device.type == "cuda", **options)


def load_epoch(loader: DataLoader, device: torch.device) -> int:
    """Load every batch of one epoch onto ``device``; returns the number of images."""
    images = 0
    for batch, _ in loader:
        images += len(batch.to(device, non_blocking=True))
    return images


def fitted_class_routers(num_features: int, experts: int, generator: torch.Generator) -> dict[str, ClassRouter]:
    """The class-level routers fitted on ``experts`` experiences of random normalised features
    (1000 samples, ``CLASSES`` classes each): timings depend on the sizes, not the values."""
    routers = {kind: ClassRouter(kind, num_features, ROUTER_WIDTH) for kind in CLASS_ROUTERS}
    for expert in range(experts):
        features = torch.nn.functional.normalize(torch.randn(1000, num_features, generator=generator), dim=-1)
        labels = torch.arange(1000) % CLASSES + expert * CLASSES
        for router in routers.values():
            router.fit(expert, features, labels)
            router.finish(expert)
    return routers
