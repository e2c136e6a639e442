"""Their code made to run here: their modules imported from ``--authors-code``, the shims while it runs (float64,
``Tensor.cuda`` the identity, prints silenced), their ``Learner`` built on a small copy of our ViT."""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import io
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator
from unittest.mock import patch

import timm
import torch
from timm.models.vision_transformer import VisionTransformer

WIDTH = 768  # hard-coded in their forward_diagonal (out_dim=768) and their qkv split


def import_authors(path: Path) -> SimpleNamespace:
    """Their modules, imported from ``path`` (their ``models``, ``utils`` and ``backbone`` packages)."""
    import timm.layers.weight_init

    if not (path / "models" / "cllora.py").is_file():
        raise ValueError(f"--authors-code must be an extracted copy of JiangpengHe/CL-LoRA holding "
                         f"models/cllora.py, got {path}")
    for name in ("models", "utils", "backbone"):
        if name in sys.modules and not str(getattr(sys.modules[name], "__file__", "")).startswith(str(path)):
            raise RuntimeError(f"a module named {name!r} is already imported from elsewhere; their code needs the name")
    sys.modules.setdefault("timm.models.layers.weight_init", timm.layers.weight_init)
    sys.path.insert(0, str(path))
    return SimpleNamespace(cllora=importlib.import_module("models.cllora"),
                           vit=importlib.import_module("backbone.vit_cllora"),
                           inc_net=importlib.import_module("utils.inc_net"), path=path)


@contextlib.contextmanager
def authors_runtime() -> Iterator[None]:
    """float64 by default, ``Tensor.cuda`` the identity (their ``torch.ones(3).cuda()``), their prints silenced."""
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with patch.object(torch.Tensor, "cuda", lambda self, *a, **k: self), contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        torch.set_default_dtype(dtype)


def authors_learner(authors: SimpleNamespace, vit: VisionTransformer, sizes: SimpleNamespace) -> Any:
    """Their ``Learner`` on ``exps/cifar.json`` with the stream's sizes, whose backbone is their loader
    applied to a copy of ``vit`` (their ``VisionTransformer`` made small)."""
    args = json.loads((authors.path / "exps" / "cifar.json").read_text())
    depth = len(vit.blocks)
    shared = depth // 2
    args.update(init_cls=sizes.classes, increment=sizes.classes, init_epochs=sizes.epochs,
                later_epochs=sizes.epochs, init_lr=sizes.lr, later_lr=sizes.lr, weight_decay=sizes.weight_decay,
                batch_size=sizes.batch, ffn_num=sizes.rank, device=["cpu"], general_pos=list(range(shared)),
                specfic_pos=list(range(shared, depth)))
    embed = vit.patch_embed

    def get_backbone(args: dict, pretrained: bool = False) -> Any:
        # utils/inc_net.py get_backbone's '_cllora' branch, with a SimpleNamespace for its EasyDict
        config = SimpleNamespace(
            use_distillation=args["use_distillation"], use_block_weight=args["use_block_weight"],
            msa_adapt=args["msa_adapt"], msa=args["msa"], specfic_pos=args["specfic_pos"],
            general_pos=args["general_pos"], ffn_adapt=True, ffn_option="parallel",
            ffn_adapter_layernorm_option="none", ffn_adapter_init_option="lora", ffn_adapter_scalar="0.1",
            ffn_num=args["ffn_num"], d_model=WIDTH, vpt_on=False, vpt_num=0, _device=args["device"][0])
        original = authors.vit.VisionTransformer

        def small(**options: Any) -> Any:
            options.update(img_size=embed.img_size[0], patch_size=embed.patch_size[0], depth=depth,
                           num_heads=vit.blocks[0].attn.num_heads, mlp_ratio=vit.blocks[0].mlp.fc1.out_features / WIDTH)
            return original(**options)

        with patch.object(authors.vit, "VisionTransformer", small), \
                patch.object(timm, "create_model", lambda *a, **k: copy.deepcopy(vit)):
            model = authors.vit.vit_base_patch16_224_in21k_cllora(
                num_classes=0, global_pool=False, drop_path_rate=0.0, tuning_config=config)
        model.out_dim = WIDTH
        return model.eval()

    with authors_runtime(), patch.object(authors.inc_net, "get_backbone", get_backbone), \
            patch.object(authors.cllora, "tqdm", functools.partial(authors.cllora.tqdm, disable=True)):
        learner = authors.cllora.Learner(args)
    return learner
