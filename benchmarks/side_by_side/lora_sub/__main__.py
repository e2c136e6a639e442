"""Our LoRA subtraction (:class:`avalanche_color.LoRASubtraction`) side by side with its authors' code on the
same weights and batches, in float64 on the CPU, and a table of the largest absolute differences.

    python -m benchmarks.side_by_side.lora_sub --authors-code /tmp/lorasub_code

``--authors-code`` is an extracted copy of scarlet0703/LoRA-Sub-DRS at 836ad29 (its fork
nqh-tq-32052503/LoRA-Sub-DRS has the same HEAD; ``git -C <mirror> archive HEAD | tar -x -C /tmp/lorasub_code``,
or ``git show HEAD:<file>`` per file where the archive stops at the two DomainNet split files that the mirror
lacks). Its modules are imported from there (``methods/lorasub_drs.py`` ``LoRAsub_DRS``,
``models/vit_lora.py`` ``Attention_LoRA``, ``models/sinet_lora.py`` ``ViT_lora_co`` and ``SiNet``,
``optimgrad/adam_proj.py`` ``Adam``, ``utils/losses.py`` ``AugmentedTripletLoss``); nothing of it is copied here.

How their code is driven. ``SiNet.__init__`` builds a pretrained ViT-B (``models/sinet_lora.py`` line 71,
``_create_vision_transformer('vit_base_patch16_224_in21k', pretrained=True)``, a download), so while
``LoRAsub_DRS.__init__`` runs, ``SiNet`` is a function that builds their ``SiNet`` object with their own
``ViT_lora_co`` at small dims (width 32, 2 blocks, 2 heads, 16 px images, patch 4) and their per-task
``classifier_pool``; ``LoRAsub_DRS.__init__`` then runs as written (their ``init_param`` of every component).
The backbone weights are our seeded timm ViT's, loaded by name. ``incremental_train`` is not called: it
builds its loaders from their data manager (``methods/lorasub_drs.py`` lines 77-83, a shuffled
``DataLoader``); its body is run instead: lines 71-73, then ``_train`` on a loader that replays the batches
our strategy trained on (first, for t > 0, the covariance pass over the experience), then ``_build_protos``
with a data manager stand-in that hands out each class's training images, then ``after_task``. Per
experience, the new component's A and B and the new head's rows are ours, copied into theirs before it
trains. ``ipdb`` (imported, unused) is a stub module. No CUDA call stops anything on CPU.

Compared: (a) the forward with 1-3 summed components and the subtracted network; (b) each block's input
covariance of the subtracted network and the projection (k and P); (c) their projected ``Adam`` against our
``ProjectedAdam`` on the same gradients (weight decay 0 and 0.01), and the whole training of two
experiences (every step's parameters, learning rates, the covariance and P at the task switch);
(d) the augmented triplet loss and its gradient; (e) the prototypes, the features and the nearest-mean
predictions.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import torch

from benchmarks.side_by_side.lora_sub.authors_code import import_authors
from benchmarks.side_by_side.lora_sub.mechanisms import compare_adam, compare_forward_and_subspace, compare_triplet
from benchmarks.side_by_side.lora_sub.our_run import run_ours
from benchmarks.side_by_side.lora_sub.stream import make_stream
from benchmarks.side_by_side.lora_sub.their_run import run_theirs
from benchmarks.side_by_side.lora_sub.training_comparison import compare_training
from benchmarks.side_by_side.lora_sub.weights import tiny_vit


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--authors-code", type=Path, required=True,
                        help="an extracted copy of scarlet0703/LoRA-Sub-DRS at 836ad29")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--rank", type=int, default=3)
    parser.add_argument("--classes", type=int, default=3, help="classes per experience")
    parser.add_argument("--per-class", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=5e-3, help="LoRA learning rate (their code: 5e-4)")
    parser.add_argument("--head-lr", type=float, default=2e-2, help="head learning rate (their code: 2e-3)")
    parser.add_argument("--margin", type=float, default=1.0)
    parser.add_argument("--weight", type=float, default=0.5, help="triplet weight lambda (their code: 0.05)")
    parser.add_argument("--steps", type=int, default=5, help="steps of the stand-alone Adam comparison")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sizes = SimpleNamespace(image=16, patch=4, experiences=2, **{k: v for k, v in vars(args).items()
                                                                  if k != "authors_code"})
    torch.set_num_threads(1)
    authors = import_authors(args.authors_code.resolve())
    vit = tiny_vit(sizes)
    rows: list[str] = []
    compare_forward_and_subspace(authors, vit, sizes, rows)
    compare_adam(authors, sizes, rows)
    compare_triplet(authors, sizes, rows)
    benchmark, test = make_stream(sizes)
    train = [(torch.stack([s[0] for s in e.dataset]), torch.tensor([int(s[1]) for s in e.dataset]))
             for e in benchmark.train_stream]
    ours = run_ours(vit, benchmark, test, sizes)
    theirs = run_theirs(authors, vit, ours, train, test, sizes)
    compare_training(ours, theirs, sizes, rows)
    print(f"LoRA subtraction, ours against scarlet0703/LoRA-Sub-DRS@836ad29, float64 CPU; ViT width {sizes.width}, "
          f"{sizes.depth} blocks, rank {sizes.rank}, {sizes.experiences} experiences x {sizes.classes} classes, "
          f"batch {sizes.batch}, {sizes.epochs} epochs, lr {sizes.lr}/{sizes.head_lr}, margin {sizes.margin}, "
          f"lambda {sizes.weight}")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
