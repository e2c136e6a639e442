"""What a pretrained ViT gives at each input size, and what it costs: the numbers behind a benchmark's image size.

For each ``--sizes`` value it prints, on one thread:

* the nearest-class-mean probe on the frozen backbone (L2-normalised [CLS] features, cosine to the
  class means): on PACS, per domain, with ``--per-class`` training images of each class of that domain
  for the means and the domain's test split of seed 0 (the stream's) for the score; on the Split
  Tiny-ImageNet stream's 100 classes, ``--per-class`` training images each and the 50 test images of each;
* the frozen forward and CoLoR's training iteration (its own ``train``, rank 8, one expert of 10 classes,
  batch 32), in images per second, timed side by side.

    python -m benchmarks.investigations.backbone_choice --backbone FILE --architecture vit_tiny_patch16_224 \\
        --data FOLDER --sizes 96 112 128 160

The images are decoded at their stored size and resized to each input size with the backbone's own
interpolation and normalisation (its ``pretrained_cfg``), as the runner's streams are.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.transforms import v2

from avalanche_color import CoLoR, ExpertViT, backbone_data_config
from avalanche_color.benchmarks.pacs import PACS_DOMAINS, PACS_FILE, load_pacs
from avalanche_color.benchmarks.stream_building import stratified_split
from avalanche_color.benchmarks.tiny_imagenet import FILE_NAME as TINY_FILE
from avalanche_color.benchmarks.tiny_imagenet import PRETRAIN_CLASSES, load_tiny_imagenet
from avalanche_color.runner.backbone_loading import load_backbone
from benchmarks.perf.strategies import Clock, TrainingTurns, quiet_evaluator, synthetic_stream, training_variant
from benchmarks.perf.timing import Variant, interleaved, seconds

STORED_SIZE = {"pacs": 64, "tiny": 32}  # the offline zips' image sides


def features(vit, images: torch.Tensor, size: int, batch: int = 128) -> torch.Tensor:
    """L2-normalised [CLS] features of uint8 images resized to ``size`` as the backbone was pretrained."""
    data = backbone_data_config(vit)
    resize = v2.Resize(size, interpolation=v2.InterpolationMode(data["interpolation"]), antialias=True)
    mean, std = torch.tensor(data["mean"]).view(1, 3, 1, 1), torch.tensor(data["std"]).view(1, 3, 1, 1)
    out = []
    with torch.no_grad():
        for start in range(0, len(images), batch):
            x = resize(images[start:start + batch]).float().div(255)
            out.append(F.normalize(vit((x - mean) / std), dim=-1))
    return torch.cat(out)


def ncm_accuracy(train: torch.Tensor, train_labels: torch.Tensor, test: torch.Tensor,
                 test_labels: torch.Tensor) -> float:
    classes = train_labels.unique()
    means = F.normalize(torch.stack([train[train_labels == c].mean(0) for c in classes]), dim=-1)
    predicted = classes[(test @ means.T).argmax(1)]
    return (predicted == test_labels).float().mean().item()


def pacs_probe(vit, data: Path, size: int, per_class: int) -> float:
    pacs = load_pacs(data / PACS_FILE, image_size=STORED_SIZE["pacs"])
    scores = []
    for index, _ in enumerate(PACS_DOMAINS):
        in_domain = (pacs["domain_ids"] == index).nonzero().squeeze(1)
        labels = pacs["labels"][in_domain]
        train, test = stratified_split(labels, 0.2, np.random.default_rng([0, index]))
        means_from = torch.cat([train[labels[train] == c][:per_class] for c in labels.unique()])
        picked, tested = in_domain[means_from], in_domain[test]
        scores.append(ncm_accuracy(features(vit, pacs["images"][picked], size), pacs["labels"][picked],
                                   features(vit, pacs["images"][tested], size), pacs["labels"][tested]))
    return sum(scores) / len(scores)


def tiny_probe(vit, data: Path, size: int, per_class: int) -> float:
    tiny = load_tiny_imagenet(data / TINY_FILE, image_size=STORED_SIZE["tiny"]).classes(PRETRAIN_CLASSES, 200)
    chosen = torch.cat([(tiny.train_labels == c).nonzero().squeeze(1)[:per_class] for c in tiny.train_labels.unique()])
    return ncm_accuracy(features(vit, tiny.train_images[chosen], size), tiny.train_labels[chosen],
                        features(vit, tiny.val_images, size), tiny.val_labels)


def speeds(vit, size: int, rounds: int, batch: int = 32) -> dict[str, float]:
    """Images per second of the frozen forward and of CoLoR's own training iteration (its ``train`` on one
    experience of 10 classes, rank 8, one iteration per round: :mod:`benchmarks.perf.strategies`)."""
    vit.set_input_size(img_size=size)
    x = torch.randn(batch, 3, size, size)
    stream = synthetic_stream(1, 10, (size, size), [(2 + rounds) * batch], batch)  # warm-up and untimed first too
    clock = Clock(torch.device("cpu"))
    strategy = CoLoR(vit, rank=8, k=5, train_epochs=1, train_mb_size=batch, eval_mb_size=batch,
                     evaluator=quiet_evaluator, plugins=[clock])  # on a copy of the ViT
    frozen = ExpertViT(vit, rank=8).eval()
    turns = TrainingTurns(strategy, stream.train_stream[0], clock).start()

    def forward() -> None:
        with torch.no_grad():
            frozen.features(x)

    rounds_seconds = interleaved({"forward": Variant(forward), "step": training_variant(turns)}, rounds,
                                 torch.device("cpu"), log=False)
    turns.close()
    return {name: batch / seconds(rounds_seconds, name).median for name in ("forward", "step")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", required=True, help="a weights file or timm name (as the runner's)")
    parser.add_argument("--architecture", default=None, help="the timm name of a state dict file")
    parser.add_argument("--data", type=Path, required=True, help="the folder holding the PACS and Tiny-ImageNet zips")
    parser.add_argument("--sizes", type=int, nargs="+", default=[96, 112, 128, 160])
    parser.add_argument("--per-class", type=int, default=20, help="training images per class for the class means")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| input px | PACS NCM | Tiny NCM (100 classes) | forward img/s | CoLoR step img/s | probe seconds |")
    print("|---|---|---|---|---|---|")
    for size in args.sizes:
        vit = load_backbone(args.backbone, architecture=args.architecture)
        vit.set_input_size(img_size=size)
        start = time.perf_counter()
        pacs, tiny = pacs_probe(vit, args.data, size, args.per_class), tiny_probe(vit, args.data, size, args.per_class)
        probe = time.perf_counter() - start
        speed = speeds(vit, size, args.rounds)
        print(f"| {size} | {100 * pacs:.1f} | {100 * tiny:.1f} | {speed['forward']:.0f} | {speed['step']:.0f} | "
              f"{probe:.0f} |", flush=True)


if __name__ == "__main__":
    main()
