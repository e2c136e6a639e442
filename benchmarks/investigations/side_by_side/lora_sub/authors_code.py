"""Their code made to run here: their modules imported from ``--authors-code`` (``ipdb`` stubbed), their prints
kept aside, their ``LoRAsub_DRS`` built on their ``SiNet`` at small dims with our ViT's weights."""

from __future__ import annotations

import contextlib
import io
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import patch

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn

THRESHOLD = 0.99  # hard-coded in their init_model_optimizer


def import_authors(path: Path) -> SimpleNamespace:
    """Their modules, imported from the extracted copy (``ipdb`` stubbed: imported, never called)."""
    if not (path / "methods" / "lorasub_drs.py").is_file():
        raise FileNotFoundError(f"--authors-code must be an extracted LoRA-Sub-DRS copy with methods/lorasub_drs.py, "
                                f"got {path}")
    sys.path.insert(0, str(path))
    sys.modules.setdefault("ipdb", types.ModuleType("ipdb"))
    import methods.lorasub_drs as drs  # noqa: E402  (their code, from --authors-code)
    import models.sinet_lora as sinet
    import models.vit_lora as vit_lora
    import optimgrad.adam_proj as adam_proj
    import utils.losses as losses

    return SimpleNamespace(drs=drs, sinet=sinet, vit_lora=vit_lora, adam=adam_proj, losses=losses)


@contextlib.contextmanager
def quiet() -> Iterator[io.StringIO]:
    """Their prints (``Parameters to be updated``, ``reserving basis``) and tqdm bars, kept aside."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        yield buffer


def their_network(authors: SimpleNamespace, vit: VisionTransformer, sizes: SimpleNamespace) -> Any:
    """Their ``SiNet`` with their ``ViT_lora_co`` at small dims, our ViT's weights loaded by name."""
    torch.set_default_dtype(torch.float64)
    try:
        encoder = authors.sinet.ViT_lora_co(img_size=sizes.image, patch_size=sizes.patch, embed_dim=sizes.width,
                                            depth=sizes.depth, num_heads=sizes.heads, num_classes=0,
                                            n_tasks=sizes.experiences, rank=sizes.rank)
        net = authors.sinet.SiNet.__new__(authors.sinet.SiNet)
        nn.Module.__init__(net)
        net.image_encoder = encoder
        net.class_num = sizes.classes
        net.classifier_pool = nn.ModuleList([nn.Linear(sizes.width, sizes.classes) for _ in range(sizes.experiences)])
        net.numtask = 0
    finally:
        torch.set_default_dtype(torch.float32)
    missing, unexpected = encoder.load_state_dict(vit.state_dict(), strict=False)
    missing = [k for k in missing if "lora_" not in k and not k.endswith("_grow")]
    if missing or unexpected:
        raise RuntimeError(f"our ViT's weights do not map onto their ViT_lora_co: missing {missing}, "
                           f"unexpected {unexpected}")
    return net.double()


def their_learner(authors: SimpleNamespace, vit: VisionTransformer, sizes: SimpleNamespace) -> Any:
    """``LoRAsub_DRS(args)`` from ``configs/cifar100.json`` with the stream's sizes, epochs, rates and the CPU."""
    args = {"prefix": "side_by_side", "dataset": "cifar100", "memory_size": 0, "memory_per_class": 0,
            "fixed_memory": True, "shuffle": False, "init_cls": sizes.classes, "increment": sizes.classes,
            "total_sessions": sizes.experiences, "model_name": "lorasub_drs", "net_type": "sip",
            "embd_dim": sizes.width, "EPSILON": 1e-8, "init_epoch": sizes.epochs, "optim": "Adam",
            "init_lr": sizes.lr, "init_lr_decay": 0.1, "init_weight_decay": 0.0, "epochs": sizes.epochs,
            "fc_lrate": sizes.head_lr, "lrate": sizes.lr, "lrate_decay": 0.1, "batch_size": sizes.batch,
            "weight_decay": 0.0, "rank": sizes.rank, "margin_inter": sizes.margin, "lambada": sizes.weight,
            "num_workers": 0, "eval": False, "device": [torch.device("cpu")]}
    with patch.object(authors.drs, "SiNet", lambda _: their_network(authors, vit, sizes)):
        return authors.drs.LoRAsub_DRS(args)


def their_attention(net: Any) -> list[Any]:
    return [block.attn for block in net.image_encoder.blocks]
