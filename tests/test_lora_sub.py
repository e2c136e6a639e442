"""LoRA subtraction (Liu & Chang, CVPR 2025), checked against formulas written out from the authors' code
(scarlet0703/LoRA-Sub-DRS at 836ad29): tiny seeded ViTs in float64, random weights, CPU, seconds.
Its strategy checks shared with SD-LoRA and InfLoRA come from lora_sum_cases.py."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from avalanche.core import SupervisedPlugin
from torch import nn

from avalanche_color.peers.lora_sub.config import LoRASubtractionConfig
from avalanche_color.peers.lora_sub.model import LoRASubtractionViT
from avalanche_color.peers.lora_sub.strategy import LoRASubtraction, augmented_triplet_loss, principal_projection
from drop_in_cases import tiny_vit
import drop_in_cases
from lora_sum_cases import (check_dtype, check_loader_options_reach_every_loader,
                            check_model_and_config_first_without_warnings,
                            check_online_stream_with_task_boundaries, check_pretrained_round_trip,
                            check_resume_equals_uninterrupted, check_signature_agrees_with_config, drop_in_accuracy,
                            tiny)
from streams import class_stream, domain_stream

pytestmark = pytest.mark.usefixtures("one_thread")

CLASSES = [[0, 1], [2, 3], [4, 5]]


# ---------------------------------------------------------------------- formulas written out


def reference_vit(vit, model, signs: list[float]):
    """A copy of ``vit`` with ``sign_i B_i A_i`` of every component i merged into k and v of every block."""
    reference = copy.deepcopy(vit)
    for block, layer in zip(reference.blocks, model.layers):
        d = layer.width
        weight = block.attn.qkv.weight.detach().clone()
        for sign, component in zip(signs, layer.components):
            for part, rows in ((0, slice(d, 2 * d)), (1, slice(2 * d, 3 * d))):  # k, v
                weight[rows] += sign * component.B[part].detach() @ component.A[part].detach()
        block.attn.qkv.weight = nn.Parameter(weight)
    return reference


def reference_features(reference, images: torch.Tensor) -> torch.Tensor:
    return reference.forward_head(reference.forward_features(images), pre_logits=True)


def reference_covariances(reference, images: torch.Tensor) -> list[torch.Tensor]:
    """Per block, (1/NT) sum over tokens of x x^T with x the block's norm1 output, block by block."""
    covariances = []
    with torch.no_grad():
        tokens = reference.norm_pre(reference._pos_embed(reference.patch_embed(images)))
        for block in reference.blocks:
            x = block.norm1(tokens).reshape(-1, tokens.shape[-1])
            covariances.append(x.T @ x / len(x))
            tokens = block(tokens)
    return covariances


def reference_projection(covariance: torch.Tensor, threshold: float) -> tuple[torch.Tensor, int]:
    """k = 1 + the first j where cumsum(s)_j / sum(s) >= threshold (s: eigenvalues, descending);
    P = V_k V_k^T / sqrt(k)."""
    values, vectors = torch.linalg.eigh(covariance)
    values, vectors = values.flip(0), vectors.flip(1)
    total, running, k = float(values.sum()), 0.0, None
    for j, value in enumerate(values.tolist()):
        running += value
        if running / total >= threshold:
            k = j + 1
            break
    basis = vectors[:, :k]
    return basis @ basis.T / math.sqrt(k), k


def reference_triplet_loss(f, y, prototypes, prototype_classes, margin, exclude_same_class=False):
    """The code's AugmentedTripletLoss loop by loop: anchors, hardest positive and negative, prototypes."""
    n = len(f)
    distances = (f.pow(2).sum(1, keepdim=True) + f.pow(2).sum(1) - 2 * f @ f.T).clamp(min=1e-12).sqrt()
    positives, negatives = [], []
    for i in range(n):
        same = y == y[i]
        positives.append(distances[i][same].max())
        negatives.append(distances[i][~same].min() if (~same).any() else distances[i][same].max() + margin)
        for j in range(len(prototypes)):
            if exclude_same_class and prototype_classes[j] == y[i]:
                continue
            centre = prototypes[j] / prototypes[j].norm()
            negatives[i] = min(negatives[i], torch.norm(f[i] - centre, 2).clamp(min=1e-12))
    return torch.relu(torch.stack(positives) - torch.stack(negatives) + margin).mean()


def float64_model(rank: int = 2) -> LoRASubtractionViT:
    return LoRASubtractionViT(tiny_vit(0).double(), LoRASubtractionConfig(rank=rank))


@pytest.mark.parametrize("finished", [False, True], ids=["learning", "finished"])
def test_the_layer_and_the_subtracted_layer_are_the_formula(finished):
    # qkv(x) = W0 x + b + [0; sum_{i<=t} B^k_i A^k_i x; sum_{i<=t} B^v_i A^v_i x];
    # subtracted: -sum_{i<t}, the current i = t left out.
    model = float64_model()
    x = torch.randn(3, 5, 32, dtype=torch.float64)
    for t, classes in enumerate(CLASSES):
        model.learn_classes(classes)
        if finished:
            model.finish_component()
        for layer in model.layers:
            W0, b, d = layer.base_layer.weight, layer.base_layer.bias, layer.width
            for mixing, last in ((model.mixing(), t + 1), (model.subtracted_mixing(), t)):
                sign = 1.0 if last == t + 1 else -1.0
                expected = x @ W0.T + b
                for i in range(last):
                    A, B = layer.components[i].A, layer.components[i].B
                    expected[..., d:2 * d] += sign * x @ A[0].T @ B[0].T
                    expected[..., 2 * d:] += sign * x @ A[1].T @ B[1].T
                torch.testing.assert_close(layer(x, mixing), expected, rtol=0, atol=1e-12)
        if not finished:
            model.finish_component()


def test_the_network_and_the_subtracted_network_are_the_formula():
    vit = tiny_vit(0).double()
    model = LoRASubtractionViT(vit, LoRASubtractionConfig(rank=2))
    images = torch.randn(4, 3, 16, 16, dtype=torch.float64)
    for t, classes in enumerate(CLASSES):
        model.learn_classes(classes)
        with torch.no_grad():
            torch.testing.assert_close(model.features(images),
                                       reference_features(reference_vit(vit, model, [1.0] * (t + 1)), images),
                                       rtol=0, atol=1e-12)
            torch.testing.assert_close(model.features(images, model.subtracted_mixing()),
                                       reference_features(reference_vit(vit, model, [-1.0] * t), images),
                                       rtol=0, atol=1e-12)
        model.finish_component()


def test_new_components_init_as_the_code_sparse_b_kaiming_a_drawn_apart_from_the_global_generators():
    model = float64_model(rank=3)
    state = torch.random.get_rng_state()
    model.learn_classes([0, 1])
    assert torch.equal(torch.random.get_rng_state(), state)
    for layer in model.layers:
        A, B = layer.components[0].A, layer.components[0].B
        assert (B != 0).sum(dim=1).tolist() == [[1, 1, 1], [1, 1, 1]]  # one N(0, 0.01^2) entry per column
        assert 0 < float(B.detach().abs().max()) < 0.06
        bound = float(A.detach().abs().max())
        assert 0.5 / math.sqrt(32) < bound <= 1 / math.sqrt(32)  # kaiming_uniform_(a=sqrt(5)): U(-1/sqrt(d), 1/sqrt(d))
    again = float64_model(rank=3)
    again.learn_classes([0, 1])
    assert torch.equal(again.layers[1].components[0].B, model.layers[1].components[0].B)
    # B != 0: a new experience's component changes the network before its first step.
    images = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    model.finish_component()
    with torch.no_grad():
        before = model.features(images)
    model.learn_classes([2, 3])
    with torch.no_grad():
        assert float((model.features(images) - before).abs().max()) > 1e-6


def test_the_basis_keeps_the_first_directions_reaching_the_threshold_of_the_summed_singular_values():
    rotation = torch.linalg.qr(torch.randn(6, 6, dtype=torch.float64))[0]
    covariance = rotation @ torch.diag(torch.tensor([8.0, 4, 2, 1, 0.6, 0.4], dtype=torch.float64)) @ rotation.T
    # Cumulative shares 0.5, 0.75, 0.875, 0.9375, 0.975, 1 (of squares: 0.75 at once, so 0.6 would keep 1).
    for threshold, k in ((0.3, 1), (0.6, 2), (0.8, 3), (0.9, 4), (0.95, 5), (0.99, 6), (1.0, 6)):
        P, got = principal_projection(covariance, threshold)
        assert got == k, threshold
        basis = rotation[:, :k]
        torch.testing.assert_close(P, basis @ basis.T / math.sqrt(k))
        torch.testing.assert_close(torch.linalg.matrix_norm(P), torch.tensor(1.0, dtype=torch.float64))
        torch.testing.assert_close(P @ P, P / math.sqrt(k))
    # The threshold met exactly (dyadic values: exact sums) counts as reached.
    diagonal = torch.diag(torch.tensor([0.5, 0.25, 0.125, 0.125], dtype=torch.float64))
    assert principal_projection(diagonal, 0.75)[1] == 2
    assert principal_projection(diagonal, 0.75 + 1e-9)[1] == 3
    assert principal_projection(torch.zeros(4, 4, dtype=torch.float64), 0.99)[1] == 4  # nothing to rank: keep all


# ---------------------------------------------------------------------- the strategy against the formulas


class Record(SupervisedPlugin):
    """Per experience: the state before training (after prepare_experience), each step's gradients and
    learning rates, each update's result, the loss terms, and the model after the experience."""

    def __init__(self) -> None:
        super().__init__()
        self.start, self.steps, self.losses, self.end = [], [], [], []

    @staticmethod
    def trained(strategy):
        return [p.detach().clone() for group in strategy.optimizer.param_groups for p in group["params"]]

    def before_training_exp(self, strategy, **kwargs):
        model = strategy.model
        self.start.append(dict(state={k: v.clone() for k, v in model.state_dict().items()},
                               trained=self.trained(strategy), projections=model.projections.clone()))
        self.steps.append([])
        self.losses.append([])

    def before_backward(self, strategy, **kwargs):
        model = strategy.model
        self.losses[-1].append(dict(loss=float(strategy.loss.detach()), features=strategy.mb_features.detach().clone(),
                                    y=strategy.mb_y.clone(), head=(model.head_weight.detach().clone(),
                                                                   model.head_bias.detach().clone()),
                                    prototypes=model.prototypes.clone(), classes=model.prototype_classes.clone()))

    def before_update(self, strategy, **kwargs):
        self.steps[-1].append(dict(grads=[p.grad.clone() for g in strategy.optimizer.param_groups for p in g["params"]],
                                   lrs=[g["lr"] for g in strategy.optimizer.param_groups]))

    def after_update(self, strategy, **kwargs):
        self.steps[-1][-1]["after"] = self.trained(strategy)

    def after_training_exp(self, strategy, **kwargs):
        self.end.append({k: v.clone() for k, v in strategy.model.state_dict().items()})


def run(experiences: int = 2, record=None, vit=None, stream=None, **options):
    vit = tiny_vit(0).double() if vit is None else vit
    stream = class_stream(num_experiences=experiences, per_class=8) if stream is None else stream
    strategy = tiny(LoRASubtraction, vit=copy.deepcopy(vit), plugins=[record] if record else [], **options)
    for experience in stream.train_stream[:experiences]:
        strategy.train(experience)
    return strategy, stream


def images_of(experience) -> tuple[torch.Tensor, torch.Tensor]:
    samples = list(experience.dataset)
    return torch.stack([s[0] for s in samples]).double(), torch.tensor([int(s[1]) for s in samples])


def test_the_covariance_pass_runs_the_subtracted_network_and_gives_the_codes_projection():
    record, vit = Record(), tiny_vit(0).double()
    strategy, stream = run(3, record, vit, train_epochs=1, threshold=0.9)
    assert len(record.start[0]["projections"]) == 0  # the first experience is not projected
    assert len(strategy.model.projections) == 0  # nor kept after its experience
    for t in (1, 2):
        model = LoRASubtractionViT(vit, LoRASubtractionConfig(rank=2))
        model.load_experts_state_dict(record.start[t]["state"])  # the components as experience t starts
        images, _ = images_of(stream.train_stream[t])
        covariances = reference_covariances(reference_vit(vit, model, [-1.0] * t), images)
        ranks = []
        for layer, covariance in enumerate(covariances):
            P, k = reference_projection(covariance, 0.9)
            torch.testing.assert_close(record.start[t]["projections"][layer], P, rtol=0, atol=1e-10)
            ranks.append(k)
        assert strategy.subspace_ranks[t - 1] == ranks and 1 < min(ranks) and max(ranks) < 32
    record = Record()
    strategy, _ = run(2, record, vit, train_epochs=1, threshold=1.0)  # the code skips a threshold of 1
    assert len(record.start[1]["projections"]) == 0 and strategy.subspace_ranks == []


def reference_adam(start, steps, projections, lrs_index=0, betas=(0.9, 0.999), eps=1e-8):
    """The code's Adam by hand: m, v from the raw gradients, step = lr sqrt(1 - b2^n) / (1 - b1^n),
    u = -step m / (sqrt(v) + eps), then A + u P, B + P u (``projections[i]``: (P, side) or None)."""
    params = [p.clone() for p in start]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for n, step in enumerate(steps, start=1):
        for i, g in enumerate(step["grads"]):
            lr = step["lrs"][0 if i < len(params) - 2 else 1]  # the LoRA group, then the head's weight and bias
            m[i] = betas[0] * m[i] + (1 - betas[0]) * g
            v[i] = betas[1] * v[i] + (1 - betas[1]) * g * g
            u = -lr * math.sqrt(1 - betas[1] ** n) / (1 - betas[0] ** n) * m[i] / (v[i].sqrt() + eps)
            if projections[i] is not None:
                P, side = projections[i]
                u = u @ P if side == "right" else P @ u
            params[i] = params[i] + u
    return params


def test_two_steps_are_the_codes_adam_with_projected_updates_and_nothing_else_moves():
    record = Record()
    run(2, record, train_epochs=1, train_mb_size=8, lr=0.01, head_lr=0.02)  # two steps per experience
    for t in (0, 1):
        steps = record.steps[t]
        assert len(steps) == 2 and [s["lrs"] for s in steps] == [[0.01, 0.02]] * 2
        layers = 2
        P = record.start[t]["projections"]
        projections = [((P[i // 2], "right") if i % 2 == 0 else (P[i // 2], "left")) if t else None
                       for i in range(2 * layers)] + [None, None]  # A, B per layer, then the head
        expected = reference_adam(record.start[t]["trained"], steps, projections)
        for got, want in zip(steps[-1]["after"], expected):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    # Experience 1 changes neither W0 nor the first component.
    before, after = record.start[1]["state"], record.end[1]
    frozen = [k for k in before if "base_layer" in k or ".components.0." in k]
    assert frozen and all(torch.equal(before[k], after[k]) for k in frozen)


def test_the_loss_is_the_current_heads_cross_entropy_plus_lambda_times_the_triplet_loss():
    record = Record()
    run(2, record, train_epochs=1, triplet_weight=0.3, margin=1.5)
    for t in (0, 1):
        for step in record.losses[t]:
            f, y = step["features"], step["y"]
            weight, bias = step["head"]
            current = CLASSES[t]
            ce = nn.functional.cross_entropy(f @ weight[current].T + bias[current], y - current[0])
            triplet = reference_triplet_loss(f / f.norm(dim=1, keepdim=True), y, step["prototypes"],
                                             step["classes"], 1.5)
            assert float(triplet) > 0
            # Avalanche accumulates the loss in a float32 tensor: its value is rounded to float32.
            assert step["loss"] == pytest.approx(float(ce + 0.3 * triplet), rel=1e-7)
        assert len(record.losses[t][0]["prototypes"]) == 2 * t  # the earlier experiences' prototypes


def test_same_class_prototypes_are_negatives_as_in_the_code_or_left_out():
    # A domain stream: the classes return, so the earlier experience's prototypes include the anchors' own classes.
    stream = domain_stream(num_domains=2, num_classes=3, per_class=8)
    for option in ("include", "exclude"):
        record = Record()
        run(2, record, stream=stream, train_epochs=1, triplet_weight=1.0, margin=3.0, same_class_prototypes=option)
        step = record.losses[1][0]
        f, y = step["features"], step["y"]
        weight, bias = step["head"]
        ce = nn.functional.cross_entropy(f @ weight.T + bias, y)
        triplet = reference_triplet_loss(f / f.norm(dim=1, keepdim=True), y, step["prototypes"], step["classes"],
                                         3.0, exclude_same_class=option == "exclude")
        assert step["loss"] == pytest.approx(float(ce + triplet), rel=1e-7)
        assert len(step["prototypes"]) == 3 and float(triplet) > 0


def test_the_triplet_loss_and_its_gradient_are_the_codes():
    generator = torch.Generator().manual_seed(0)
    f = torch.randn(7, 5, generator=generator, dtype=torch.float64)
    f = (f / f.norm(dim=1, keepdim=True)).requires_grad_()
    y = torch.tensor([0, 0, 1, 1, 1, 2, 0])
    prototypes = torch.randn(4, 5, generator=generator, dtype=torch.float64) * 3
    classes = torch.tensor([0, 1, 3, 1])
    losses = []
    for count, exclude in ((0, False), (4, False), (4, True)):
        got = augmented_triplet_loss(f, y, prototypes[:count], classes[:count], 1.0,
                                     "exclude" if exclude else "include")
        want = reference_triplet_loss(f, y, prototypes[:count], classes[:count], 1.0, exclude)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-14)
        torch.testing.assert_close(torch.autograd.grad(got, f)[0], torch.autograd.grad(want, f)[0],
                                   rtol=0, atol=1e-14)
        losses.append(float(got.detach()))
    assert len(set(losses)) == 3  # the prototypes, and leaving out the anchor's class's, change the loss here
    one_class = torch.zeros(7, dtype=torch.long)  # no negative in the batch: an = ap + margin
    got = augmented_triplet_loss(f, one_class, prototypes[:0], classes[:0], 2.0)
    torch.testing.assert_close(got, reference_triplet_loss(f, one_class, prototypes[:0], classes[:0], 2.0))
    assert float(got.detach()) == pytest.approx(0.0, abs=1e-12)  # relu(ap - (ap + m) + m)
    got = augmented_triplet_loss(f, one_class, prototypes, classes, 2.0)  # then the prototypes are the negatives
    torch.testing.assert_close(got, reference_triplet_loss(f, one_class, prototypes, classes, 2.0), rtol=0, atol=1e-14)
    assert float(got.detach()) > 0


def test_prototypes_are_class_means_never_updated_and_evaluation_is_the_nearest_mean():
    record, vit = Record(), tiny_vit(0).double()
    strategy, stream = run(2, record, vit, train_epochs=1)
    model = strategy.model.eval()
    for t in (0, 1):
        state = LoRASubtractionViT(vit, LoRASubtractionConfig(rank=2))
        state.load_experts_state_dict(record.end[t])
        reference = reference_vit(vit, state, [1.0] * (t + 1))
        images, labels = images_of(stream.train_stream[t])
        with torch.no_grad():
            features = reference_features(reference, images)
        expected = torch.stack([features[labels == c].mean(0) for c in CLASSES[t]])
        torch.testing.assert_close(model.prototypes[2 * t: 2 * t + 2], expected, rtol=0, atol=1e-12)
        assert model.prototype_classes[2 * t: 2 * t + 2].tolist() == CLASSES[t]
    torch.testing.assert_close(model.prototypes[:2], record.end[0]["prototypes"], rtol=0, atol=0)  # never updated
    images = torch.stack([s[0] for e in stream.test_stream for s in e.dataset]).double()
    with torch.no_grad():
        f = reference_features(reference, images)
        logits = model(images)
    f = f / (f.norm(dim=1, keepdim=True) + 1e-8)
    c = model.prototypes / model.prototypes.norm(dim=1, keepdim=True)
    squared = ((f[:, None, :] - c[None, :, :]) ** 2).sum(-1)
    torch.testing.assert_close(logits, -squared, rtol=0, atol=1e-12)
    assert torch.equal(logits.argmax(1), squared.argmin(1))


def code_cosine_factors(epochs: int) -> list[float]:
    """The factor of each epoch under the code's ``CosineSchedule(optimizer, K=epochs)``, stepped after every
    epoch: its ``_LRScheduler.__init__`` calls ``self.step(last_epoch + 1)`` (epoch 0's factor) and then sets
    ``self.last_epoch = last_epoch`` (-1), so the first ``step()`` sets epoch 0's factor again."""
    last_epoch, factors = -1, []
    for _ in range(epochs):
        factors.append(math.cos(99 * math.pi * max(last_epoch, 0) / (200 * (epochs - 1))))
        last_epoch += 1  # step(): epoch = last_epoch + 1, and the factor of that epoch is set
    return factors


def test_the_codes_epoch_cosine_for_both_groups_one_epoch_late_as_it_runs():
    record = Record()
    run(2, record, train_epochs=4, lr=0.01, head_lr=0.03)
    expected = code_cosine_factors(4)
    assert expected[0] == expected[1] == 1.0 and expected[3] == pytest.approx(math.cos(99 * math.pi * 2 / 600))
    for t in (0, 1):
        per_epoch = len(record.steps[t]) // 4
        for e in range(4):
            for step in record.steps[t][e * per_epoch:(e + 1) * per_epoch]:
                assert step["lrs"] == pytest.approx([0.01 * expected[e], 0.03 * expected[e]])


def test_the_first_experience_runs_its_own_epochs_on_the_later_ones_cosine_as_the_codes_init_epoch():
    # ImageNet-R's code: task 0 runs init_epoch = 40 epochs under CosineSchedule(K = epochs = 50); here 3 and 2.
    record = Record()
    run(2, record, train_epochs=2, first_experience_epochs=3, lr=0.01, head_lr=0.03)
    late = lambda e: math.cos(99 * math.pi * max(e - 1, 0) / (200 * (2 - 1)))  # noqa: E731  K = train_epochs
    for t, epochs in ((0, 3), (1, 2)):
        steps = record.steps[t]
        assert len(steps) % epochs == 0
        per_epoch = len(steps) // epochs
        for e in range(epochs):
            for step in steps[e * per_epoch:(e + 1) * per_epoch]:
                assert step["lrs"] == pytest.approx([0.01 * late(e), 0.03 * late(e)])
    assert len(record.steps[0]) // 3 == len(record.steps[1]) // 2  # same batches per epoch: 3 epochs, then 2


def test_without_first_experience_epochs_a_users_train_epochs_is_left_alone():
    strategy, _ = run(1, None, train_epochs=2)
    strategy.train_epochs = 1  # an Avalanche habit: set on the strategy between experiences
    record = Record()
    strategy.plugins.append(record)
    experience = class_stream(num_experiences=2, per_class=8).train_stream[1]
    strategy.train(experience)
    assert len(record.steps[0]) == math.ceil(len(experience.dataset) / strategy.train_mb_size)  # one epoch
    assert strategy.train_epochs == 1


def test_a_domain_stream_keeps_a_prototype_per_class_and_experience_and_predicts_the_nearest_ones_class():
    record = Record()
    stream = domain_stream(num_domains=2, num_classes=3, per_class=8)
    strategy, _ = run(2, record, stream=stream, train_epochs=1)
    model = strategy.model.eval()
    assert model.prototype_classes.tolist() == [0, 1, 2, 0, 1, 2]
    assert model.prototype_experiences.tolist() == [0, 0, 0, 1, 1, 1]
    assert torch.equal(model.prototypes[:3], record.end[0]["prototypes"])
    # The code's fresh head per task: a returning class's rows are drawn anew when its experience starts.
    assert not torch.equal(record.start[1]["state"]["head_weight"], record.end[0]["head_weight"])
    images = torch.stack([s[0] for s in stream.test_stream[0].dataset]).double()
    with torch.no_grad():
        f = model.features(images)
        predicted = model(images).argmax(1)
    f = f / (f.norm(dim=1, keepdim=True) + 1e-8)
    c = model.prototypes / model.prototypes.norm(dim=1, keepdim=True)
    nearest = ((f[:, None, :] - c[None, :, :]) ** 2).sum(-1).argmin(1)
    assert torch.equal(predicted, model.prototype_classes[nearest])


# ---------------------------------------------------------------------- as a package strategy


def test_signature_agrees_with_config():
    check_signature_agrees_with_config(LoRASubtraction, LoRASubtractionConfig)


def test_bad_options_are_refused_by_name():
    for name, value, allowed in (("rank", 0, "integer >= 1"), ("threshold", 1.5, r"number in \(0, 1\]"),
                                 ("margin", 0.0, "number > 0"), ("triplet_weight", -1.0, "number >= 0"),
                                 ("same_class_prototypes", "drop", "'include', 'exclude'"),
                                 ("head_lr", -1.0, "number > 0"), ("lr_schedule", "step", "'constant', 'cosine'"),
                                 ("num_workers", -1, "integer >= 0")):
        with pytest.raises(ValueError, match=rf"{name} must .*{allowed}.*got {value!r}"):
            LoRASubtraction(model=tiny_vit(), **{name: value})
    with pytest.raises(TypeError, match=r"takes no optimiser object as optimizer=, got SGD; set lr, head_lr"):
        LoRASubtraction(model=tiny_vit(), optimizer=torch.optim.SGD(tiny_vit().parameters(), lr=0.1))
    with pytest.raises(TypeError, match="VisionTransformer"):
        LoRASubtraction(model=torch.nn.Linear(3, 3))
    from avalanche.training.plugins import ReplayPlugin

    with pytest.raises(ValueError, match="cannot use ReplayPlugin: the method is rehearsal-free"):
        LoRASubtraction(model=tiny_vit(), plugins=[ReplayPlugin(mem_size=10)])


def test_resume_after_a_crash_mid_experience_equals_the_uninterrupted_run(tmp_path):
    # The crash falls inside the second experience: its projections come back from the checkpoint.
    check_resume_equals_uninterrupted(LoRASubtraction, tmp_path)


def test_save_pretrained_from_pretrained_predicts_identically(tmp_path):
    check_pretrained_round_trip(LoRASubtraction, LoRASubtractionViT, tmp_path)


def test_the_saved_state_holds_every_component_and_the_prototypes():
    strategy, _ = run(2, train_epochs=1)
    state = strategy.model.experts_state_dict()
    for name in ("prototypes", "prototype_classes", "prototype_experiences", "head_weight"):
        assert name in state
    assert len(state["prototypes"]) == 4
    for block in range(2):
        for component in range(2):
            for factor in ("A", "B"):
                assert f"backbone.blocks.{block}.attn.qkv.components.{component}.{factor}" in state
    assert not any("base_layer" in k for k in state)


def test_the_model_and_the_config_come_first_silently():
    check_model_and_config_first_without_warnings(LoRASubtraction, LoRASubtractionViT)


def test_loader_options_reach_every_loader(monkeypatch):
    check_loader_options_reach_every_loader(LoRASubtraction, monkeypatch)


@pytest.mark.parametrize("stream", list(drop_in_cases.STREAMS))
def test_learns_every_stream_naive_runs(stream, tmp_path):
    assert drop_in_accuracy(LoRASubtraction, stream, tmp_path) > drop_in_cases.LEARNED


def test_online_stream_with_task_boundaries_trains_one_component_per_experience(tmp_path):
    check_online_stream_with_task_boundaries(LoRASubtraction, tmp_path)


def test_a_float64_backbone_trains_and_evaluates_in_float64(tmp_path):
    check_dtype(LoRASubtraction, torch.float64, tmp_path)


@pytest.mark.parametrize("precision, dtype", [("bf16-mixed", torch.float32), ("16-mixed", torch.float32),
                                              ("32-true", torch.bfloat16)])
def test_narrow_precisions_train_and_score_nearest_means_in_float32(precision, dtype):
    # The prototypes and the distances stay float32 (bfloat16's 8 bits would tie near classes).
    strategy, stream = run(2, vit=tiny_vit(0).to(dtype), train_epochs=1, precision=precision)
    model = strategy.model.eval()
    images = torch.stack([s[0] for s in stream.test_stream[1].dataset])
    with torch.no_grad(), strategy.autocast():
        logits = model(images)
    assert logits.dtype == torch.float32 and model.prototypes.dtype == torch.float32
    assert bool(torch.isfinite(logits[:, :4]).all())
