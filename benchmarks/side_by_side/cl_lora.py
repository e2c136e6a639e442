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
import contextlib
import copy
import functools
import importlib
import io
import json
import sys
import traceback
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator, Optional
from unittest.mock import patch

import timm
import torch
from avalanche.benchmarks import tensors_benchmark
from avalanche.core import SupervisedPlugin
from avalanche.evaluation.metrics import accuracy_metrics
from avalanche.training.plugins import EvaluationPlugin
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor
from torch.nn import functional as F

from avalanche_color.peers.cl_lora.losses import orthogonality_loss
from avalanche_color.peers.cl_lora.model import CLLoRAViT
from avalanche_color.peers.cl_lora.strategy import CLLoRA

AUTHORS_COMMIT = "df4e74efe589ca1aa872d3843315ab6851192cf3"
WIDTH = 768  # hard-coded in their forward_diagonal (out_dim=768) and their qkv split
MODES = ("deferred", "no-version-bump", "torch")
Named = dict[str, Tensor]


# ---------------------------------------------------------------------- the authors' code


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


class RecordingSGD(torch.optim.SGD):
    """Torch's SGD with their parameters and options, under one of :data:`MODES`; keeps the gradients that
    the first batch's ``step()`` calls see and calls ``on_batch`` after each batch's last step."""

    def __init__(self, params: Any, mode: str, steps_per_batch: int, on_batch: Callable[[], None],
                 **options: Any) -> None:
        super().__init__(params, **options)
        self.mode, self.steps_per_batch, self.on_batch = mode, steps_per_batch, on_batch
        self.calls, self.first_batch = 0, []
        self._kept: dict[int, Optional[Tensor]] = {}

    def _parameters(self) -> list[Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        position = self.calls % self.steps_per_batch
        self.calls += 1
        if self.calls <= self.steps_per_batch:
            self.first_batch.append({id(p): p.grad.clone() for p in self._parameters() if p.grad is not None})
        if self.mode == "torch":
            super().step()
        elif self.mode == "no-version-bump":
            self._step_through_data()
        elif self.steps_per_batch == 2 and position == 0:  # deferred: keep the KD gradients, no step yet
            self._kept = {id(p): None if p.grad is None else p.grad.clone() for p in self._parameters()}
        elif self.steps_per_batch == 2:
            current = {id(p): p.grad for p in self._parameters()}
            for p in self._parameters():
                p.grad = self._kept[id(p)]
            super().step()  # step 1: the reweighted KD gradients, taken at the batch's parameters
            for p in self._parameters():
                p.grad = current[id(p)]
            super().step()  # step 2: cross-entropy and orthogonality, at the batch's parameters too
        else:
            super().step()
        if position == self.steps_per_batch - 1:
            self.on_batch()

    def _step_through_data(self) -> None:
        """SGD (momentum, weight decay, no dampening, no Nesterov) written through ``.data``: the update
        does not bump the parameters' version counters."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                d = p.grad.data
                if group["weight_decay"]:
                    d = d.add(p.data, alpha=group["weight_decay"])
                state = self.state[p]
                if state.get("momentum_buffer") is None:
                    state["momentum_buffer"] = d.clone()
                else:
                    state["momentum_buffer"].mul_(group["momentum"]).add_(d)
                p.data.add_(state["momentum_buffer"], alpha=-group["lr"])


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


def their_named(net: Any, started: int) -> dict[str, list[Tensor]]:
    """Their tensors under our names (q and v stacked on use): the shared adapters, the teacher, each started
    experience's specific adapters, block weights and proxy head."""
    b = net.backbone
    out: dict[str, list[Tensor]] = {}
    qv = [i for i, on in enumerate(b.msa) if on]
    for i, pos in enumerate(b.general_pos):
        k = b.adapt_pos.index(pos)
        out[f"shared.{i}.down"] = [b.cur_adapter[k][m].lora_B.weight for m in qv]
        out[f"shared.{i}.up"] = [b.cur_adapter[k][m].lora_A.weight for m in qv]
        if len(b.old_adapter_list):
            out[f"teacher.{i}.up"] = [b.old_adapter_list[-1][k][m].lora_A.weight for m in qv]
    for e in range(started):
        finished = e < len(b.adapter_list)
        for j, pos in enumerate(b.specfic_pos):
            adapter = b.adapter_list[e][j] if finished else b.cur_adapter[b.adapt_pos.index(pos)]
            out[f"specific.{e}.{j}.down"] = [adapter[m].lora_B.weight for m in qv]
            out[f"specific.{e}.{j}.up"] = [adapter[m].lora_A.weight for m in qv]
        out[f"block_weights.{e}"] = [b.block_weight_list[e] if finished else b.block_weight]
        head = net.fc_list[e] if e < len(net.fc_list) else net.proxy_fc
        out[f"proxy.{e}.weight"], out[f"proxy.{e}.sigma"] = [head.weight], [head.sigma]
    return out


def stacked(tensors: list[Tensor]) -> Tensor:
    return tensors[0].detach().clone() if len(tensors) == 1 else torch.stack([t.detach() for t in tensors])


# ---------------------------------------------------------------------- ours


def our_named(model: CLLoRAViT) -> Named:
    bank, heads = model.adapters, model.experiences
    out: Named = {}
    for i, adapter in enumerate(bank.shared):
        out[f"shared.{i}.down"], out[f"shared.{i}.up"] = adapter.down, adapter.up
        if model.num_experts > 1 or heads.training_experience() is None:
            out[f"teacher.{i}.up"] = bank.teacher_up[i]
    for e, adapters in enumerate(bank.specific):
        for j, adapter in enumerate(adapters):
            out[f"specific.{e}.{j}.down"], out[f"specific.{e}.{j}.up"] = adapter.down, adapter.up
        out[f"block_weights.{e}"] = bank.block_weights[e]
        out[f"proxy.{e}.weight"], out[f"proxy.{e}.sigma"] = heads.proxy_weights[e], heads.proxy_sigmas[e]
    return out


def snapshot(named: Named) -> Named:
    return {k: v.detach().clone() for k, v in named.items()}


class Recorder(SupervisedPlugin):
    """What our strategy did: per experience its batches, its state before the first step and after each
    batch, and for the first batch the loss terms, both steps' gradients and the features."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: dict[int, list[tuple[Tensor, Tensor]]] = defaultdict(list)
        self.start: dict[int, Named] = {}
        self.steps: dict[int, list[Named]] = defaultdict(list)
        self.first: dict[int, dict[str, Any]] = {}
        self.shared_gradients: dict[int, list[tuple[float, float]]] = defaultdict(list)  # (|KD|, |CE|) per batch

    def before_update(self, strategy: CLLoRA, **kwargs: Any) -> None:
        model = strategy.model
        e = model.training_experience()
        assert e is not None
        x, y = strategy.mb_x.detach().clone(), strategy.mb_y.detach().clone()
        self.batches[e].append((x, y))
        if strategy.kd_loss is not None:
            shared = {id(a.up) for a in model.adapters.shared}
            parameters = list(model.trainable_parameters())
            kd = [g for p, g in zip(parameters, strategy._kd_gradients) if id(p) in shared and g is not None]
            ce = [p.grad for p in parameters if id(p) in shared and p.grad is not None]
            self.shared_gradients[e].append((float(torch.stack([g.norm() for g in kd]).norm()),
                                             float(torch.stack([g.norm() for g in ce]).norm())))
        if e in self.start:
            return
        named = our_named(model)
        self.start[e] = snapshot(named)
        ids = {id(v): k for k, v in named.items()}
        parameters = list(model.trainable_parameters())
        second = {ids[id(p)]: p.grad.detach().clone() for p in parameters if p.grad is not None}
        first = {}
        if strategy.kd_loss is not None:
            first = {ids[id(p)]: g.detach().clone() for p, g in zip(parameters, strategy._kd_gradients)
                     if g is not None}
        bank = model.adapters
        record = dict(ce=strategy._criterion(strategy.mb_output, strategy.mb_y).item(),
                      logits=strategy.mb_output[:, model.experiences.class_ids(e)].detach().clone(),
                      kd=None if strategy.kd_loss is None else strategy.kd_loss.item(),
                      ortho=orthogonality_loss(list(bank.block_weights[:e]), bank.block_weights[e]).item(),
                      step1=first, step2=second)
        with torch.no_grad():
            features = {f"network of experience {i}": model.experience_features(x, i) for i in range(e + 1)}
            if e:
                features["KD student (shared blocks, norm)"] = model.pooled(bank.shared_tokens(model.blocks,
                                                                                             model.tokens(x)))
                features["KD teacher"] = model.teacher_features(x)
        record["features"] = features
        self.first[e] = record

    def after_training_iteration(self, strategy: CLLoRA, **kwargs: Any) -> None:
        self.steps[strategy.model.training_experience()].append(snapshot(our_named(strategy.model)))


# ---------------------------------------------------------------------- stream and sizes


def make_stream(sizes: SimpleNamespace) -> tuple[Any, list[tuple[Tensor, Tensor]]]:
    """Train and test tensors per experience; ``domain``: the same classes shifted per experience."""
    g = torch.Generator().manual_seed(sizes.seed)
    templates = 2 * torch.randn(sizes.classes * (1 if sizes.stream == "domain" else sizes.experiences), 3,
                                sizes.image, sizes.image, generator=g)
    train, test = [], []
    for e in range(sizes.experiences):
        offset = 1.5 * torch.randn(3, 1, 1, generator=g) if sizes.stream == "domain" else 0
        first = 0 if sizes.stream == "domain" else e * sizes.classes
        labels = torch.arange(first, first + sizes.classes).repeat_interleave(sizes.per_class)
        for store in (train, test):
            images = templates[labels] + 0.5 * torch.randn(len(labels), 3, sizes.image, sizes.image, generator=g)
            store.append((images + offset, labels))
    return tensors_benchmark(train, test, task_labels=[0] * sizes.experiences), test


def their_labels(y: Tensor, e: int, sizes: SimpleNamespace) -> Tensor:
    return y + e * sizes.classes if sizes.stream == "domain" else y


def their_predictions(logits: Tensor, sizes: SimpleNamespace) -> Tensor:
    """Their prediction as a class of ours: the class of the best (experience, class) column."""
    predicted = logits.argmax(1)
    return predicted % sizes.classes if sizes.stream == "domain" else predicted


def their_class_scores(logits: Tensor, sizes: SimpleNamespace) -> Tensor:
    """Their logits as ours: on a domain stream a class's best score over its experiences."""
    if sizes.stream != "domain":
        return logits
    return logits.reshape(logits.shape[0], -1, sizes.classes).amax(1)


# ---------------------------------------------------------------------- the runs


def run_ours(vit: VisionTransformer, benchmark: Any, test: list, sizes: SimpleNamespace) -> dict[str, Any]:
    recorder = Recorder()
    strategy = CLLoRA(vit, rank=sizes.rank, train_epochs=sizes.epochs, train_mb_size=sizes.batch, eval_mb_size=64,
                      lr=sizes.lr, momentum=0.9, weight_decay=sizes.weight_decay, plugins=[recorder],
                      evaluator=EvaluationPlugin(accuracy_metrics(stream=True), loggers=[]), device="cpu")
    results: dict[str, Any] = dict(recorder=recorder, end={}, prototypes={}, eval={})
    for e, experience in enumerate(benchmark.train_stream):
        strategy.train(experience, shuffle=False)
        model = strategy.model
        results["end"][e] = snapshot(our_named(model))
        results["prototypes"][e] = model.experiences.prototypes[model.experiences.rows(e)].detach().clone()
        model.eval()
        with torch.no_grad():
            x = torch.cat([t[0] for t in test[:e + 1]])
            results["eval"][e] = model(x)[:, :sizes.classes * (1 if sizes.stream == "domain" else e + 1)]
    return results


class EpochBatches:
    """Their ``train_loader``: ``(index, x, y)`` batches, epoch k's batches on the k-th iteration."""

    def __init__(self, epochs: list[list[tuple[None, Tensor, Tensor]]]) -> None:
        self.epochs, self.count = epochs, 0

    def __len__(self) -> int:
        return len(self.epochs[0])

    def __iter__(self) -> Iterator[tuple[None, Tensor, Tensor]]:
        batches = self.epochs[min(self.count, len(self.epochs) - 1)]
        self.count += 1
        return iter(batches)


def run_theirs(authors: SimpleNamespace, vit: VisionTransformer, ours: dict[str, Any], test: list,
               sizes: SimpleNamespace, mode: str) -> dict[str, Any]:
    learner = authors_learner(authors, vit, sizes)
    net = learner._network
    recorder: Recorder = ours["recorder"]
    results: dict[str, Any] = dict(end={}, prototypes={}, eval={}, steps=defaultdict(list), first={}, error=None)
    for e in range(sizes.experiences):
        with authors_runtime():
            learner._cur_task += 1
            learner._total_classes = learner._known_classes + sizes.classes
            net.update_fc(learner._total_classes)
            named = their_named(net, e + 1)
            new = [k for k in named if k.startswith((f"specific.{e}.", f"block_weights.{e}", f"proxy.{e}."))]
            new += [k for k in named if k.startswith("shared.")] if e == 0 else []
            with torch.no_grad():
                for k in new:  # the new experience's draws: ours
                    for m, t in enumerate(named[k]):
                        t.copy_(recorder.start[e][k][m] if len(named[k]) > 1 else recorder.start[e][k])
            batches = [(None, x.double(), their_labels(y, e, sizes)) for x, y in recorder.batches[e]]
            per_epoch = len(batches) // sizes.epochs
            loader = EpochBatches([batches[k * per_epoch:(k + 1) * per_epoch] for k in range(sizes.epochs)])
            results["first"][e] = their_first_batch(authors, learner, batches[0], e, sizes)
            original = learner.get_optimizer

            def get_optimizer(lr: float, e: int = e) -> RecordingSGD:
                sgd = original(lr)  # their parameters and options
                options = {k: sgd.defaults[k] for k in ("lr", "momentum", "weight_decay")}
                optimizer = RecordingSGD(sgd.param_groups[0]["params"], mode, 2 if e else 1,
                                         lambda: results["steps"][e].append(
                                             {k: stacked(v) for k, v in their_named(net, e + 1).items()}),
                                         **options)
                optimizers[e] = optimizer
                return optimizer

            learner.get_optimizer = get_optimizer
            optimizers: dict[int, RecordingSGD] = {}
            try:
                with patch.object(authors.cllora, "tqdm", functools.partial(authors.cllora.tqdm, disable=True)):
                    learner._train(loader, None)
            except RuntimeError as error:
                frames = [f for f in traceback.extract_tb(error.__traceback__) if str(authors.path) in f.filename]
                where = frames[-1] if frames else None
                results["error"] = (e, f"{Path(where.filename).relative_to(authors.path)}:{where.lineno} "
                                       f"`{where.line}`" if where else "?", str(error).split("\n")[0])
                return results
            finally:
                del learner.get_optimizer
                results["first"][e]["step_grads"] = first_batch_gradients(net, optimizers.get(e), e + 1)
            net.add_fc()
            labels = torch.cat([y for _, _, y in batches[:per_epoch]])
            learner.train_dataset_for_protonet = SimpleNamespace(labels=labels.numpy())
            learner.replace_fc([(None, x, y) for _, x, y in batches[:per_epoch]])
            rows = slice(learner._known_classes, learner._total_classes)
            results["prototypes"][e] = net.fc.weight[rows, e * WIDTH:(e + 1) * WIDTH].detach().clone()
            net.eval()
            with torch.no_grad():
                x = torch.cat([t[0] for t in test[:e + 1]]).double()
                results["eval"][e] = net(x, test=True)["logits"]
            learner.after_task()
            # after after_task, as ours after finish_experience: the teacher is the experience's shared U's
            results["end"][e] = {k: stacked(v) for k, v in their_named(net, e + 1).items()}
    return results


def first_batch_gradients(net: Any, optimizer: Optional[RecordingSGD], started: int) -> list[Named]:
    """The gradients their ``step()`` calls saw on the first batch, under our names."""
    if optimizer is None:
        return []
    named = their_named(net, started)
    out = []
    for grads in optimizer.first_batch:
        out.append({k: stacked([grads[id(t)] for t in v]) for k, v in named.items()
                    if all(id(t) in grads for t in v)})
    return out


def their_first_batch(authors: SimpleNamespace, learner: Any, batch: tuple, e: int,
                      sizes: SimpleNamespace) -> dict[str, Any]:
    """Their loss terms and features on the experience's first batch, at its starting parameters (their
    functions; the KD weight 5 and temperature 2 are written inside ``_init_train``, so they are repeated)."""
    net, cllora = learner._network, authors.cllora
    b = net.backbone
    _, x, y = batch
    net.train()
    record: dict[str, Any] = {}
    logits = net(x, test=False)["logits"]
    record["logits"] = logits.detach().clone()
    record["ce"] = F.cross_entropy(logits, y - learner._known_classes).item()
    record["kd"] = record["ortho"] = None
    if e:
        new, teacher = net.forward_kd(x, e)
        record["kd"] = (5.0 * cllora._KD_loss(new["logits"], teacher["logits"], T=2)).item()
        record["ortho"] = float(cllora.compute_orthogonality_loss(b.block_weight_list, b.block_weight))
    else:
        record["ortho"] = 0.0
    with torch.no_grad():
        features = {f"network of experience {i}": b.forward_proto(x, adapt_index=i) for i in range(e + 1)}
        if e:
            student, teacher = b.forward_general_cls(x, e)
            features["KD student (shared blocks, norm)"], features["KD teacher"] = student, teacher
    record["features"] = features
    return record


# ---------------------------------------------------------------------- comparison


def max_abs(a: Tensor, b: Tensor) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def group_of(name: str) -> str:
    parts = name.split(".")
    if parts[0] in ("shared", "teacher"):
        return f"{parts[0]} {parts[-1]}"
    if parts[0] == "specific":
        return f"specific {parts[1]} {parts[-1]}"
    return " ".join(parts[:-1] + [parts[-1]]) if parts[0] == "proxy" else name


def grouped(ours: Named, theirs: Named) -> dict[str, tuple[float, float]]:
    """Per group of names: (max |ours - theirs|, max |ours|)."""
    out: dict[str, tuple[float, float]] = {}
    for k in ours:
        if k not in theirs:
            continue
        g = group_of(k)
        d, s = out.get(g, (0.0, 0.0))
        out[g] = (max(d, max_abs(ours[k], theirs[k])), max(s, float(ours[k].abs().max())))
    return out


def row(label: str, difference: float, scale: Optional[float] = None) -> str:
    tail = "" if scale is None else f"   (max |value| {scale:.3g})"
    return f"  {label:<52} {difference:10.2e}{tail}"


def report(ours: dict[str, Any], theirs: dict[str, Any], sizes: SimpleNamespace, mode: str) -> list[str]:
    lines = [f"== their optimiser: {mode}"]
    recorder: Recorder = ours["recorder"]
    for e in range(sizes.experiences):
        if e not in theirs["first"]:
            break
        mine, other = recorder.first[e], theirs["first"][e]
        lines.append(f" experience {e}, first batch, at its starting parameters")
        for name, f in mine["features"].items():
            lines.append(row(f"(a) feature: {name}", max_abs(f, other["features"][name]), float(f.abs().max())))
        lines.append(row("(b) proxy logits", max_abs(mine["logits"], other["logits"]), float(mine["logits"].abs().max())))
        for term in ("ce", "kd", "ortho"):
            if mine[term] is not None:
                lines.append(row(f"(b) loss {term} = {mine[term]:.6g}", abs(mine[term] - other[term])))
        steps = other.get("step_grads") or {}
        for s, key in ((0, "step1"), (1, "step2")):
            if not mine[key] or s >= len(steps):
                continue
            label = ("step 1: KD, reweighted" if e and s == 0 else "step 2: CE + 1e-4 ortho" if e else "CE")
            for g, (d, scale) in grouped(mine[key], steps[s]).items():
                lines.append(row(f"(b) gradient, {label}: {g}", d, scale))
    if theirs["error"]:
        e, where, message = theirs["error"]
        lines.append(f" experience {e}: their code raised at {where}: RuntimeError: {message}")
        return lines
    for e in range(sizes.experiences):
        mine_steps, their_steps = recorder.steps[e], theirs["steps"][e]
        worst = max(max(d for d, _ in grouped(a, b).values()) for a, b in zip(mine_steps, their_steps))
        lines.append(f" experience {e}: {len(their_steps)} batches")
        lines.append(row(f"(c) parameters, worst over its batches", worst))
        for g, (d, scale) in grouped(ours["end"][e], theirs["end"][e]).items():
            lines.append(row(f"(c) parameters at its end: {g}", d, scale))
        lines.append(row("(c) prototypes", max_abs(ours["prototypes"][e], theirs["prototypes"][e]),
                         float(ours["prototypes"][e].abs().max())))
        mine_eval, their_eval = ours["eval"][e], theirs["eval"][e]
        scores = their_class_scores(their_eval, sizes)
        agree = int((mine_eval.argmax(1) == their_predictions(their_eval, sizes)).sum())
        lines.append(row("(d) evaluation scores", max_abs(mine_eval, scores)))
        lines.append(f"  (d) predictions agree on {agree}/{len(mine_eval)} test images")
    return lines


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
