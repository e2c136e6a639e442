"""Pretrains the offline backbone: a small timm ViT on the first 100 Tiny-ImageNet classes, 32 px.

    python -m benchmarks.pretraining.tiny_imagenet [--data PATH] [--epochs N] [--threads N] [--out FILE]

CoLoR needs a pretrained ViT; where none can be downloaded, this trains one on the 100
classes that the Split Tiny-ImageNet stream never uses, sized to train on one CPU core in a
few hours (a GPU is used when present; the time and accuracy of the committed run are in
``vit_tinyimagenet100_32px.json``).
It checkpoints after every epoch and resumes from the last checkpoint when run again with the
same configuration. The result (headless, with its config and validation accuracy) is written
to the package's ``avalanche_color/backbones/`` and loaded by ``load_backbone("offline")``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import timm
import torch
from torch import Tensor, nn
from tqdm import tqdm

from avalanche_color.utils.files import torch_save_atomically
from avalanche_color.benchmarks.archives import CACHE_DIR
from avalanche_color.benchmarks.tiny_imagenet import PRETRAIN_CLASSES, load_tiny_imagenet
from avalanche_color.runner.backbone_loading import OFFLINE_BACKBONE, save_backbone

ARCHITECTURE = "vit_tiny_patch16_224"  # a registered timm ViT, resized by MODEL_KWARGS
MEAN = STD = (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class Config:
    image_size: int = 32
    patch_size: int = 4  # 8 x 8 = 64 patch tokens (+ [CLS])
    embed_dim: int = 96
    depth: int = 4
    num_heads: int = 3
    epochs: int = 30
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.05
    drop_path_rate: float = 0.0  # stochastic depth while pretraining only; not saved with the model
    warmup_epochs: int = 2
    label_smoothing: float = 0.1
    seed: int = 0

    def model_kwargs(self) -> dict:
        return dict(img_size=self.image_size, patch_size=self.patch_size, embed_dim=self.embed_dim,
                    depth=self.depth, num_heads=self.num_heads)


def augment(images: Tensor, generator: torch.Generator) -> Tensor:
    """Random crop (4 px zero padding) and horizontal flip, per image, on a uint8 batch."""
    n, _, size, _ = images.shape
    padded = nn.functional.pad(images, (4, 4, 4, 4))
    dx, dy = torch.randint(0, 9, (2, n), generator=generator)
    rows = (dy[:, None] + torch.arange(size))[:, :, None]          # (n, size, 1)
    cols = (dx[:, None] + torch.arange(size))[:, None, :]          # (n, 1, size)
    batch = torch.arange(n)[:, None, None]
    cropped = padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2)
    flip = torch.rand(n, generator=generator) < 0.5
    cropped[flip] = cropped[flip].flip(-1)
    return cropped


def normalise(images: Tensor) -> Tensor:
    mean = torch.tensor(MEAN, device=images.device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=images.device).view(1, 3, 1, 1)
    return (images.float() / 255 - mean) / std


@torch.no_grad()
def evaluate(model: nn.Module, images: Tensor, labels: Tensor, device: torch.device) -> float:
    model.eval()
    correct = 0
    for batch in torch.arange(len(labels)).split(500):
        logits = model(normalise(images[batch].to(device)))
        correct += (logits.argmax(1).cpu() == labels[batch]).sum().item()
    return correct / len(labels)


def learning_rate(step: int, steps_per_epoch: int, config: Config) -> float:
    """Linear warm-up, then cosine decay to zero, per step."""
    warmup = config.warmup_epochs * steps_per_epoch
    total = config.epochs * steps_per_epoch
    if step < warmup:
        return config.lr * (step + 1) / warmup
    return config.lr * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


README = Path(__file__).with_name("README.md")  # the offline backbone's record, with its training curve
CURVE_BEGIN, CURVE_END = "<!-- curve: written by tiny_imagenet.py -->", "<!-- end of curve -->"


def curve_table(history: list[dict]) -> str:
    """The per-epoch training curve as a Markdown table."""
    rows = [f"| {h['epoch']} | {h['train_loss']:.3f} | {100 * h['val_accuracy']:.1f}% |" for h in history]
    return "\n".join(["| epoch | train loss | val accuracy |", "|---:|---:|---:|", *rows])


def write_curve(readme: Path, history: list[dict]) -> None:
    """Replaces the table between the curve markers of ``readme``, if it has them."""
    if not readme.is_file():
        return
    text = readme.read_text()
    if CURVE_BEGIN in text and CURVE_END in text:
        head, rest = text.split(CURVE_BEGIN, 1)
        readme.write_text(f"{head}{CURVE_BEGIN}\n{curve_table(history)}\n{CURVE_END}{rest.split(CURVE_END, 1)[1]}")


def pretrain(config: Config, data: Path, out: Path, checkpoint: Path) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dataset = load_tiny_imagenet(data, image_size=config.image_size).classes(0, PRETRAIN_CLASSES)
    torch.manual_seed(config.seed)
    model = timm.create_model(ARCHITECTURE, pretrained=False, num_classes=PRETRAIN_CLASSES,
                              drop_path_rate=config.drop_path_rate, **config.model_kwargs()).to(device)
    model.pretrained_cfg = {**model.pretrained_cfg, "mean": MEAN, "std": STD,
                            "input_size": (3, config.image_size, config.image_size)}
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    generator = torch.Generator().manual_seed(config.seed)
    history: list[dict] = []
    start_epoch, seconds = 0, 0.0
    if checkpoint.exists():
        state = torch.load(checkpoint, map_location="cpu", weights_only=False)
        if state["config"] != asdict(config):
            raise ValueError(f"checkpoint {str(checkpoint)!r} was written with another config "
                             f"({state['config']}); delete it or pass the same options")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        start_epoch, history, seconds = state["epoch"], state["history"], state["seconds"]
        print(f"resuming from {checkpoint} after epoch {start_epoch}")

    images, labels = dataset.train_images, dataset.train_labels
    steps_per_epoch = len(labels) // config.batch_size
    criterion = nn.CrossEntropyLoss(label_smoothing=config.label_smoothing)
    for epoch in range(start_epoch, config.epochs):
        began = time.perf_counter()
        model.train()
        order = torch.randperm(len(labels), generator=generator)[: steps_per_epoch * config.batch_size]
        total_loss = 0.0
        for step, batch in enumerate(tqdm(order.split(config.batch_size), desc=f"epoch {epoch + 1}/{config.epochs}",
                                          leave=False)):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(epoch * steps_per_epoch + step, steps_per_epoch, config)
            inputs = normalise(augment(images[batch], generator).to(device))
            loss = criterion(model(inputs), labels[batch].to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total_loss += loss.item()
        accuracy = evaluate(model, dataset.val_images, dataset.val_labels, device)
        seconds += time.perf_counter() - began
        history.append({"epoch": epoch + 1, "train_loss": total_loss / steps_per_epoch, "val_accuracy": accuracy})
        print(f"epoch {epoch + 1}/{config.epochs}: loss {total_loss / steps_per_epoch:.3f}, val accuracy {accuracy:.3f}, "
              f"{seconds / 60:.1f} min so far", flush=True)
        torch_save_atomically({"config": asdict(config), "model": model.state_dict(),
                               "optimizer": optimizer.state_dict(), "generator": generator.get_state(),
                               "torch_rng": torch.get_rng_state(), "epoch": epoch + 1, "history": history,
                               "seconds": seconds}, checkpoint)

    record = {
        "data": "Tiny-ImageNet classes 0-99 of wnids.txt (file order), 500 train images each, 32 px",
        "config": asdict(config),
        "val_accuracy": history[-1]["val_accuracy"],
        "history": history,
        "device": (f"cpu, {torch.get_num_threads()} thread(s)" if device.type == "cpu"
                   else torch.cuda.get_device_name(device)),
        "train_minutes": round(seconds / 60, 1),
        "torch": str(torch.__version__),
        "timm": timm.__version__,
    }
    save_backbone(model.cpu(), out, architecture=ARCHITECTURE, model_kwargs=config.model_kwargs(),
                  extra={"pretraining": record})
    out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    if out.resolve() == OFFLINE_BACKBONE.resolve():  # the shipped file: its record is the README beside this script
        write_curve(README, history)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="Tiny-ImageNet zip or folder (default: in $AVALANCHE_COLOR_DATA)")
    parser.add_argument("--epochs", type=int, default=Config.epochs)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="CPU threads for torch (default: torch's own choice)")
    parser.add_argument("--out", type=Path, default=OFFLINE_BACKBONE)
    parser.add_argument("--checkpoint", type=Path, default=CACHE_DIR / "pretrain_backbone_last.pt")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    record = pretrain(Config(epochs=args.epochs), args.data, args.out, args.checkpoint)
    print(f"validation accuracy {record['val_accuracy']:.3f} after {record['train_minutes']} min; "
          f"written to {args.out}")


if __name__ == "__main__":
    main()
