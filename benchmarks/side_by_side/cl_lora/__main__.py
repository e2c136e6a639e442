"""Our CL-LoRA (:class:`avalanche_color.CLLoRA`) side by side with its authors' code on the same weights and
batches, in float64 on the CPU, and a table of the largest absolute differences.

    python -m benchmarks.side_by_side.cl_lora --authors-code /tmp/cllora_code

``--authors-code`` is an extracted copy of JiangpengHe/CL-LoRA at df4e74e (``git -C <mirror> archive HEAD |
tar -x -C /tmp/cllora_code``); its modules are imported from there (``models/cllora.py`` ``Learner``,
``backbone/vit_cllora.py``, ``utils/inc_net.py`` ``OurNet``), nothing of it is copied here.

How their code is driven. Their ``Learner`` is built from ``exps/cifar.json`` with only the stream's sizes,
the epochs and the device changed, and ``utils.inc_net.get_backbone`` replaced by a call of their own
``vit_base_patch16_224_in21k_cllora`` in which ``timm.create_model`` returns our seeded timm ViT and their
``VisionTransformer`` gets small depth, heads, MLP ratio and image size (their loader then splits its qkv,
renames the MLP and sets what trains, as in their runs). The width stays 768: their
``CosineLinearFeature.forward_diagonal`` and their qkv split hard-code it. Per experience the script runs
``Learner.incremental_train``'s body without the data manager: ``OurNet.update_fc``, ``Learner._train`` (their
optimiser, schedule and ``_init_train`` loop) on the batches our strategy trained on, ``OurNet.add_fc``,
``Learner.replace_fc``, their evaluation forward, ``Learner.after_task``. The weights that each side draws for
a new experience (adapters, block weights, proxy head) are ours, copied into theirs before it trains.
Three things are shimmed while their code runs: ``torch.Tensor.cuda`` is the identity
(``Attention_lora.forward`` calls ``torch.ones(3).cuda()`` for the shared blocks' coefficients), the
default dtype is float64 (so their new modules are float64), and ``timm.models.layers.weight_init`` is
aliased to ``timm.layers.weight_init`` (``backbone/linears.py`` imports the timm 0.6 path).

Their per-batch sequence from the second experience on (``_init_train``: the KD backward, its reweighting,
``optimizer.step()``, then ``loss.backward()`` of the graph built before that step, ``optimizer.step()``)
runs under three optimisers, all torch's SGD with their parameters and options:

* ``torch``: stock SGD; the second backward raises on current torch (reported with the line).
* ``deferred``: the first ``step()`` of a batch only keeps the reweighted KD gradients; the second applies
  them, then the cross-entropy ones: both gradients at the batch's parameters, our reading.
* ``no-version-bump``: SGD's update written through ``param.data``, which leaves the parameters' autograd
  version counters alone, as torch 2.0.1's CUDA ``foreach`` SGD did: their literal sequence then runs and
  the second backward reads the tensors it saved (the shared U's, the proxy weight and sigma) after step 1.

Stream: ``--stream domain`` (the default; the same classes in every experience, their code seeing class c
of experience e as class ``e * classes + c``, so a prediction is the class of the best (experience, class)
pair) or ``--stream class``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import torch
from timm.models.vision_transformer import VisionTransformer

from benchmarks.side_by_side.cl_lora.authors_code import WIDTH, import_authors
from benchmarks.side_by_side.cl_lora.our_run import run_ours
from benchmarks.side_by_side.cl_lora.stream import make_stream
from benchmarks.side_by_side.cl_lora.table import report
from benchmarks.side_by_side.cl_lora.their_optimiser import MODES
from benchmarks.side_by_side.cl_lora.their_run import run_theirs

AUTHORS_COMMIT = "df4e74efe589ca1aa872d3843315ab6851192cf3"


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--authors-code", type=Path, required=True,
                        help=f"extracted copy of JiangpengHe/CL-LoRA (commit {AUTHORS_COMMIT[:7]})")
    parser.add_argument("--stream", choices=("domain", "class"), default="domain")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--mlp-ratio", type=float, default=1.0)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--classes", type=int, default=3)
    parser.add_argument("--per-class", type=int, default=8)
    parser.add_argument("--experiences", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.03)
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    options = parser.parse_args(argv)
    torch.set_num_threads(options.threads)
    sizes = SimpleNamespace(**vars(options), image=16)
    authors = import_authors(options.authors_code.resolve())

    torch.manual_seed(options.seed)
    vit = VisionTransformer(img_size=sizes.image, patch_size=4, embed_dim=WIDTH, depth=options.depth,
                            num_heads=options.heads, mlp_ratio=options.mlp_ratio, num_classes=0).double().eval()
    benchmark, test = make_stream(sizes)
    ours = run_ours(vit, benchmark, test, sizes)
    print(f"CL-LoRA, ours against JiangpengHe/CL-LoRA@{AUTHORS_COMMIT[:7]}: float64, CPU, {sizes.stream} stream, "
          f"{sizes.experiences} experiences x {sizes.classes} classes x {sizes.per_class} images, ViT width {WIDTH} "
          f"depth {sizes.depth} ({sizes.depth // 2} shared), rank {sizes.rank}, batch {sizes.batch}, "
          f"{sizes.epochs} epochs, lr {sizes.lr}, weight decay {sizes.weight_decay}; max |ours - theirs|")
    recorder = ours["recorder"]
    for e in range(1, sizes.experiences):
        ratios = ", ".join(f"{kd:.2e}/{ce:.2e}" for kd, ce in recorder.shared_gradients[e])
        drift = max(float((ours["end"][e][k] - ours["end"][e - 1][k]).norm() / ours["end"][e - 1][k].norm())
                    for k in ours["end"][e] if k.startswith("shared.") and k.endswith(".up"))
        print(f"ours, experience {e}: |gradient of the shared U's| per batch, KD (reweighted) / CE: {ratios}; "
              f"largest relative change of a shared U over the experience: {drift:.3f}")
    for mode in options.modes:
        theirs = run_theirs(authors, vit, ours, test, sizes, mode)
        print("\n".join(report(ours, theirs, sizes, mode)), flush=True)


if __name__ == "__main__":
    main()
