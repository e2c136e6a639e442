"""Their side: their ``Learner`` driven through the stream on the batches our strategy trained on (our draws
copied in first, our labels as theirs), the optimiser their per-batch sequence runs under (torch's SGD with their
parameters and options, in one of :data:`MODES`), and what it did, under our names."""

from __future__ import annotations

import functools
import traceback
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator, Optional
from unittest.mock import patch

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor
from torch.nn import functional as F

from benchmarks.investigations.side_by_side.cl_lora.authors_code import WIDTH, authors_learner, authors_runtime
from benchmarks.investigations.side_by_side.cl_lora.our_run import Named, Recorder

MODES = ("deferred", "no-version-bump", "torch")


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


def their_labels(y: Tensor, e: int, sizes: SimpleNamespace) -> Tensor:
    """Our labels of experience ``e`` as theirs: on a domain stream class c of experience e is their ``e * classes + c``."""
    return y + e * sizes.classes if sizes.stream == "domain" else y


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
