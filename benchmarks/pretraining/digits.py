"""Pretrain the main job's small ViT on held-out digits and write ``vit_digits_16px.pt``.

    python -m benchmarks.pretraining.digits            # about a minute on one CPU core

The committed file is what ``load_backbone("digits")`` (and ``make main``) uses, so every
machine starts from the same weights; this command makes it again. Pretraining on another
CPU gives other weights (float sums differ), and so other numbers downstream: the digest it
prints is the one ``results.json`` records as ``backbone``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import timm

from avalanche_color.benchmarks.digits import DIGITS_VIT, digits_split, pretrained_vit
from avalanche_color.runner.backbone_loading import DIGITS_BACKBONE, save_backbone
from avalanche_color.runner.provenance import weights_digest

EPOCHS = 60
SEED = 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DIGITS_BACKBONE)
    args = parser.parse_args(argv)
    weights = pretrained_vit(digits_split(SEED), epochs=EPOCHS, seed=SEED)
    model = timm.create_model(DIGITS_VIT["architecture"], pretrained=False, num_classes=0, **DIGITS_VIT["model_kwargs"])
    model.load_state_dict(weights)
    # The streams centre the images around 0 (avalanche_color.benchmarks.digits.normalise).
    model.pretrained_cfg = {**model.pretrained_cfg, "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}
    record = {"data": "scikit-learn's digits: the 30% held out from the streams (seed 0), 16 px, plain domain",
              "epochs": EPOCHS, "seed": SEED, "weights_digest": weights_digest(model)}
    save_backbone(model, args.out, architecture=DIGITS_VIT["architecture"], model_kwargs=DIGITS_VIT["model_kwargs"],
                  extra={"record": record})
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
