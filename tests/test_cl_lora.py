"""CL-LoRA (He, Duan, Zhu, CVPR 2025): its formulas written out against the authors' code (float64, a tiny
4-block ViT with 2 shared and 2 task-specific blocks), then the strategy's options, files and resume.
Tiny ViTs, CPU, seconds."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from avalanche.core import SupervisedPlugin
from torch.func import functional_call
from torch.nn import functional as F

from avalanche_color.lora import trained_dtype
from avalanche_color.peers.cl_lora.config import CLLoRAConfig
from avalanche_color.peers.cl_lora.model import CLLoRAQKV, CLLoRAViT, QVUpdate, cosine_logits
from avalanche_color.peers.cl_lora.strategy import CLLoRA, distillation_loss, orthogonality_loss, reassignment_weights
from helpers import quiet_evaluator, stream_metric
from streams import class_stream, domain_stream, tiny_vit

pytestmark = pytest.mark.usefixtures("one_thread")

DEPTH, RANK = 4, 2


def vit64(seed: int = 0):
    """A token-pooling ViT (the code's CLS feature) in float64, 4 blocks: 2 shared, 2 task-specific."""
    return tiny_vit(seed, depth=DEPTH).double()


def strategy64(vit, **options):
    settings = dict(rank=RANK, train_epochs=1, train_mb_size=16, eval_mb_size=64, lr=0.05,
                    evaluator=quiet_evaluator())
    return CLLoRA(vit, **{**settings, **options})


def stream64(**options):
    """A class stream (float32 images: the model converts them to the ViT's float64 exactly)."""
    return class_stream(**{"num_experiences": 2, "per_class": 8, **options})


def merged_features(vit, model: CLLoRAViT, x, experience=None, *, teacher=False):
    """timm's own forward of ``vit`` with each adapter's update merged into its qkv weight:
    ``W_q + w_q U_q D_q`` and ``W_v + w_v U_v D_v`` (shared blocks w = 1, the teacher's U with ``teacher``);
    ``experience=None``: the shared blocks only, then the final norm (the distillation's forward)."""
    shared, bank = model.num_shared, model.adapters
    reference = copy.deepcopy(vit)
    if experience is None:
        reference.blocks = reference.blocks[:shared]
    overrides = {}
    for i, block in enumerate(reference.blocks):
        W = block.attn.qkv.weight
        d = W.shape[1]
        if i < shared:
            D = bank.shared[i].down
            U = bank.teacher_up[i] if teacher else bank.shared[i].up
            wq = wv = 1.0
        else:
            D, U = bank.specific[experience][i - shared].down, bank.specific[experience][i - shared].up
            wq, wv = bank.block_weights[experience][0, i - shared], bank.block_weights[experience][2, i - shared]
        overrides[f"blocks.{i}.attn.qkv.weight"] = torch.cat(
            (W[:d] + wq * U[0] @ D[0], W[d:2 * d], W[2 * d:] + wv * U[1] @ D[1]))
    return functional_call(reference, overrides, (x,))  # num_classes=0: the pooled feature


def train_one_experience(seed=0):
    """A model after one experience of training (float64), its ViT and its stream."""
    vit, benchmark = vit64(seed), stream64()
    strategy = strategy64(vit, train_epochs=2)
    strategy.train(benchmark.train_stream[0])
    return strategy, vit, benchmark


# ---------------------------------------------------------------------- layer, init


def test_layer_adds_weighted_low_rank_updates_to_q_and_v_only():
    torch.manual_seed(0)
    d, r = 6, 2
    base = torch.nn.Linear(d, 3 * d).double()
    layer, x = CLLoRAQKV(base), torch.randn(5, 3, d, dtype=torch.float64)
    D, U, w = torch.randn(2, r, d, dtype=torch.float64), torch.randn(2, d, r, dtype=torch.float64), \
        torch.tensor([0.7, 1.3], dtype=torch.float64)
    plain = x @ base.weight.T + base.bias
    expected = plain.clone()
    expected[..., :d] += w[0] * (x @ D[0].T @ U[0].T)
    expected[..., 2 * d:] += w[1] * (x @ D[1].T @ U[1].T)
    torch.testing.assert_close(layer(x, QVUpdate(D, U, w)), expected)
    expected_unweighted = plain.clone()
    expected_unweighted[..., :d] += x @ D[0].T @ U[0].T
    expected_unweighted[..., 2 * d:] += x @ D[1].T @ U[1].T
    torch.testing.assert_close(layer(x, QVUpdate(D, U)), expected_unweighted)
    torch.testing.assert_close(layer(x), plain)


def test_initialisation_is_the_codes_and_drawn_apart_from_the_global_generators():
    vit = vit64()
    config = CLLoRAConfig(rank=RANK, init_seed=3)
    state = torch.get_rng_state()
    model = CLLoRAViT(vit, config)
    model.train().start_experience([4, 1, 7])
    assert torch.equal(torch.get_rng_state(), state)
    d, S = 32, 2
    # The code: D = Qᵀ of qr(rand(d, r)), U = 0; drawn per block, q then v (shared at construction).
    g = torch.Generator().manual_seed(3 * 1_000_003)
    for adapter in model.adapters.shared:
        for part in range(2):
            Q, _ = torch.linalg.qr(torch.rand(d, RANK, generator=g).double())
            assert torch.equal(adapter.down[part], Q.T)
            torch.testing.assert_close(adapter.down[part] @ adapter.down[part].T, torch.eye(RANK, dtype=torch.float64))
        assert not adapter.up.any()
    g = torch.Generator().manual_seed(3 * 1_000_003 + 1)
    for adapter in model.adapters.specific[0]:
        for part in range(2):
            Q, _ = torch.linalg.qr(torch.rand(d, RANK, generator=g).double())
            assert torch.equal(adapter.down[part], Q.T)
        assert not adapter.up.any()
    weights = torch.rand(3, DEPTH - S, generator=g, dtype=torch.float64) + 0.5  # U(0.5, 1.5)
    assert torch.equal(model.adapters.block_weights[0], weights)
    proxy = (torch.rand(3, d, generator=g, dtype=torch.float64) * 2 - 1) / math.sqrt(d)  # U(±1/√d)
    torch.testing.assert_close(model.experiences.proxy_weights[0], proxy, rtol=0, atol=1e-15)
    assert model.experiences.proxy_sigmas[0].tolist() == [1.0]
    assert model.experiences.class_ids(0) == [4, 1, 7] and model.max_class_label == 8
    # U = 0 everywhere: the network is the ViT, whatever the block weights.
    x = torch.randn(4, 3, 16, 16, dtype=torch.float64)
    torch.testing.assert_close(model.experience_features(x, 0), vit(x))


def test_a_new_experience_starts_from_the_shared_adapters_alone():
    strategy, vit, benchmark = train_one_experience()
    model = strategy.model
    model.train().start_experience([2, 3])
    x = torch.randn(4, 3, 16, 16, dtype=torch.float64)
    reference = copy.deepcopy(vit)
    with torch.no_grad():
        for i in range(model.num_shared):
            qkv, (D, U), d = reference.blocks[i].attn.qkv, model.adapters.shared[i].parameters(), 32
            qkv.weight[:d] += U[0] @ D[0]
            qkv.weight[2 * d:] += U[1] @ D[1]
        assert model.adapters.shared[0].up.abs().sum() > 0  # the shared U learned in experience 0
        torch.testing.assert_close(model.experience_features(x, 1), reference(x))


# ---------------------------------------------------------------------- what trains


class Snapshots(SupervisedPlugin):
    def __init__(self):
        super().__init__()
        self.starts, self.optimised = [], []

    def before_training_exp(self, strategy, **kwargs):
        self.starts.append({k: v.clone() for k, v in strategy.model.experts_state_dict().items()})
        self.optimised.append([p for group in strategy.optimizer.param_groups for p in group["params"]])


def test_what_trains_in_each_experience():
    snapshots = Snapshots()
    strategy = strategy64(vit64(), train_epochs=2, plugins=[snapshots])
    benchmark = stream64(num_experiences=3)
    for experience in benchmark.train_stream:
        strategy.train(experience)
    model, bank = strategy.model, strategy.model.adapters
    after = model.experts_state_dict()
    states = snapshots.starts + [after]
    for e in range(3):
        start, end = states[e], states[e + 1]
        # Parameters and the teacher (the experiences' buffers grow with the next experience's rows).
        compared = [k for k in start if not k.startswith("experiences.") or k.split(".")[1].startswith("proxy")]
        changed = {k for k in compared if not torch.equal(start[k], end[k])}
        expected = {f"adapters.shared.{i}.up" for i in range(2)} | \
            {f"adapters.specific.{e}.{j}.{p}" for j in range(2) for p in ("down", "up")} | \
            {f"adapters.block_weights.{e}", f"experiences.proxy_weights.{e}", f"experiences.proxy_sigmas.{e}"}
        # The teacher becomes the shared U's at the experience's end.
        expected |= {"adapters.teacher_up"}
        assert changed == expected, (e, changed ^ expected)
    assert [len(params) for params in snapshots.optimised] == [2 + 4 + 3] * 3
    d, r = 32, RANK  # the shared U's, the specific D's and U's, 3 x 2 block weights, a proxy over 2 classes, σ
    count = 2 * 2 * d * r + 2 * 2 * 2 * d * r + 6 + 2 * d + 1
    assert [sum(p.numel() for p in params) for params in snapshots.optimised] == [count] * 3
    assert model.experience_parameter_count(0, 2) == count
    names = {id(p): n for n, p in model.named_parameters()}
    for e, params in enumerate(snapshots.optimised):  # the optimiser holds exactly these
        assert sorted(names[id(p)] for p in params) == sorted(
            [f"adapters.shared.{i}.up" for i in range(2)] +
            [f"adapters.specific.{e}.{j}.{p}" for j in range(2) for p in ("down", "up")] +
            [f"adapters.block_weights.{e}", f"experiences.proxy_weights.{e}", f"experiences.proxy_sigmas.{e}"])
    assert torch.equal(bank.teacher_up, torch.stack([a.up for a in bank.shared]))
    assert not any(p.requires_grad for p in model.parameters())  # between experiences nothing trains


# ---------------------------------------------------------------------- losses


def test_proxy_head_is_sigma_times_the_cosine():
    torch.manual_seed(0)
    f, w, sigma = torch.randn(5, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64), \
        torch.tensor([1.7], dtype=torch.float64)
    expected = sigma * (f @ w.T) / (f.norm(dim=1, keepdim=True) * w.norm(dim=1))
    torch.testing.assert_close(cosine_logits(f, w, sigma), expected)


def test_distillation_is_the_codes_and_reaches_the_head_through_the_teacher_too():
    torch.manual_seed(0)
    student, teacher = torch.randn(6, 8, dtype=torch.float64), torch.randn(6, 8, dtype=torch.float64)
    w = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    sigma = torch.tensor([1.2], dtype=torch.float64, requires_grad=True)

    def head(f):
        return sigma * F.normalize(f, dim=1) @ F.normalize(w, dim=1).T

    z_s, z_t, T = head(student), head(teacher), 2.0
    expected = 5 * (-1 / 6) * (torch.softmax(z_t / T, 1) * torch.log_softmax(z_s / T, 1)).sum()
    got = 5 * distillation_loss(z_s, z_t, T)
    torch.testing.assert_close(got, expected)
    grads = torch.autograd.grad(got, (w, sigma), retain_graph=True)
    expected_grads = torch.autograd.grad(expected, (w, sigma))
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e)
    detached = torch.autograd.grad(5 * distillation_loss(head(student), head(teacher).detach(), T), (w, sigma))
    assert not torch.allclose(detached[0], grads[0])  # the teacher branch contributes (not detached)


def test_gradient_reassignment_weights_rows_by_the_teachers_up_norms():
    torch.manual_seed(0)
    U = torch.randn(2, 10, 3, dtype=torch.float64)  # (parts, d, r)
    for part in range(2):
        n = torch.stack([U[part, i].norm() for i in range(10)])
        torch.testing.assert_close(reassignment_weights(U)[part], 10 * n / n.sum())
    assert reassignment_weights(torch.zeros(2, 10, 3)).eq(1).all()  # a teacher that never learned


def test_orthogonality_of_the_block_weights():
    torch.manual_seed(0)
    earlier = [torch.randn(3, 2, dtype=torch.float64) for _ in range(3)]
    current = torch.randn(3, 2, dtype=torch.float64)
    unit = current.flatten() / (current.flatten().norm() + 1e-8)
    expected = sum(abs(float(w.flatten() / (w.flatten().norm() + 1e-8) @ unit)) for w in earlier) / 3
    assert float(orthogonality_loss(earlier, current)) == pytest.approx(expected, rel=1e-12)
    assert float(orthogonality_loss([], current)) == 0.0


# ---------------------------------------------------------------------- one batch of experience 1, by hand


class SecondBatch(SupervisedPlugin):
    """The model, momentum buffers and batch as the second step of the given experience sees them, and the
    parameters after it. (In the first batch the student is its teacher, so the shared U's get no
    distillation gradient.)"""

    def __init__(self, experience: int):
        super().__init__()
        self.experience, self.model, self.updated = experience, None, None

    def before_training_iteration(self, strategy, **kwargs):
        if strategy.experience.current_experience == self.experience and strategy.clock.train_epoch_iterations == 1:
            self.model = copy.deepcopy(strategy.model)
            self.batch = (strategy.mb_x.clone(), strategy.mb_y.clone())
            names = {id(p): n for n, p in strategy.model.named_parameters()}
            self.buffers = {names[id(p)]: s["momentum_buffer"].clone() for p, s in strategy.optimizer.state.items()}

    def after_training_iteration(self, strategy, **kwargs):
        if strategy.experience.current_experience == self.experience and strategy.clock.train_epoch_iterations == 1:
            self.updated = {n: p.detach().clone() for n, p in strategy.model.named_parameters()}


@pytest.mark.parametrize("shared_blocks, second_step_gradient", [(None, "batch_start"), (3, "batch_start"),
                                                                  (None, "after_step_one")])
def test_two_sgd_steps_per_batch_by_hand(shared_blocks, second_step_gradient):
    """Experience 1, its second batch: step 1 = SGD on the distillation gradient (shared U's reassigned), only
    on the parameters it reaches; step 2 = SGD on CE + 1e-4 ortho, its gradient at the parameters before
    step 1 (or, with ``second_step_gradient="after_step_one"``, at those step 1 left). Momentum 0.9 (its
    buffer updated by both steps) and weight decay, the first epoch's rate."""
    vit, benchmark = vit64(), stream64()
    batch = SecondBatch(1)
    lr, wd = 0.05, 1e-4
    strategy = strategy64(vit, train_mb_size=8, plugins=[batch], weight_decay=wd, shared_blocks=shared_blocks,
                          second_step_gradient=second_step_gradient)
    for experience in benchmark.train_stream:
        strategy.train(experience)
    m0, (x, y) = batch.model, batch.batch
    x = x.double()
    params = list(m0.trainable_parameters())
    names = {id(p): n for n, p in m0.named_parameters()}
    bank, heads = m0.adapters, m0.experiences
    w, sigma = heads.proxy_weights[1], heads.proxy_sigmas[1]

    def proxy(f):
        return sigma * F.normalize(f, dim=1) @ F.normalize(w, dim=1).T

    local = torch.tensor([heads.class_ids(1).index(int(c)) for c in y])
    unit = lambda b: b.flatten() / (b.flatten().norm() + 1e-8)  # noqa: E731

    def step_two_loss(model):
        heads, bank = model.experiences, model.adapters
        w, sigma = heads.proxy_weights[1], heads.proxy_sigmas[1]
        ce = F.cross_entropy(sigma * F.normalize(merged_features(vit, model, x, 1), dim=1)
                             @ F.normalize(w, dim=1).T, local)
        return ce + 1e-4 * (unit(bank.block_weights[0]) * unit(bank.block_weights[1])).sum().abs()

    second = torch.autograd.grad(step_two_loss(m0), params)
    kd = 5 * (-1 / len(x)) * (torch.softmax(proxy(merged_features(vit, m0, x, teacher=True)) / 2, 1) *
                              torch.log_softmax(proxy(merged_features(vit, m0, x)) / 2, 1)).sum()
    first_grads = list(torch.autograd.grad(kd, params, allow_unused=True))
    for i, p in enumerate(params):
        if names[id(p)].startswith("adapters.shared."):
            teacher = bank.teacher_up[int(names[id(p)].split(".")[2])]
            n = teacher.norm(dim=2)  # (parts, d): the teacher U's row norms
            first_grads[i] = first_grads[i] * (n.shape[1] * n / n.sum(dim=1, keepdim=True)).unsqueeze(-1)
    reached = {names[id(p)] for p, g in zip(params, first_grads) if g is not None}
    shared = 2 if shared_blocks is None else shared_blocks  # None: the first half
    assert m0.num_shared == shared and len(bank.block_weights[1][0]) == DEPTH - shared
    assert reached == {f"adapters.shared.{i}.up" for i in range(shared)} | {"experiences.proxy_weights.1",
                                                                           "experiences.proxy_sigmas.1"}
    assert all(g.abs().sum() > 0 for g in first_grads if g is not None)
    after_one, buffers = {}, {}
    for p, g1 in zip(params, first_grads):
        name, p = names[id(p)], p.detach()
        buffers[name] = batch.buffers[name]
        if g1 is not None:
            buffers[name] = 0.9 * buffers[name] + g1 + wd * p
            p = p - lr * buffers[name]
        after_one[name] = p
    if second_step_gradient == "after_step_one":  # step 2's gradient again, at the parameters step 1 left
        m1 = copy.deepcopy(m0)
        with torch.no_grad():
            for name, p in m1.named_parameters():
                if name in after_one:
                    p.copy_(after_one[name])
        moved = torch.autograd.grad(step_two_loss(m1), list(m1.trainable_parameters()))
        assert any(not torch.allclose(a, b) for a, b in zip(moved, second))  # step 1 moved what step 2 sees
        second = moved
    for p, g2 in zip(params, second):
        name = names[id(p)]
        buffer = 0.9 * buffers[name] + g2 + wd * after_one[name]
        torch.testing.assert_close(batch.updated[name], after_one[name] - lr * buffer, rtol=0, atol=1e-13, msg=name)


# ---------------------------------------------------------------------- prototypes, evaluation, schedule


class EndOfExperience(SupervisedPlugin):
    """A copy of the model after each experience (prototypes set, everything frozen)."""

    def __init__(self):
        super().__init__()
        self.models = []

    def after_training_exp(self, strategy, **kwargs):
        self.models.append(copy.deepcopy(strategy.model))


def test_prototypes_are_class_means_under_their_experiences_network_and_never_change():
    ends = EndOfExperience()
    vit, benchmark = vit64(), stream64(num_experiences=3)
    strategy = strategy64(vit, train_epochs=2, plugins=[ends])
    for experience in benchmark.train_stream:
        strategy.train(experience)
    for e, experience in enumerate(benchmark.train_stream):
        model = ends.models[e]
        images = torch.stack([sample[0] for sample in experience.dataset]).double()
        labels = torch.tensor([int(sample[1]) for sample in experience.dataset])
        with torch.no_grad():
            features = merged_features(vit, model, images, e)  # the shared U's at the end of e
        classes = model.experiences.class_ids(e)
        expected = torch.stack([features[labels == c].mean(0) for c in classes])
        rows = model.experiences.rows(e)
        torch.testing.assert_close(model.experiences.prototypes[rows], expected)
        # Later experiences leave them as they were.
        assert torch.equal(strategy.model.experiences.prototypes[rows], model.experiences.prototypes[rows])


def test_evaluation_scores_each_class_in_its_experience_with_the_current_shared_adapters():
    vit, benchmark = vit64(), stream64(num_experiences=3)
    strategy = strategy64(vit, train_epochs=2)
    for experience in benchmark.train_stream:
        strategy.train(experience)
    model = strategy.model.eval()
    x = torch.stack([sample[0] for e in benchmark.test_stream for sample in e.dataset]).double()
    expected = torch.full((len(x), 6), float("-inf"), dtype=torch.float64)
    full = []
    with torch.no_grad():
        for e in range(3):
            f = merged_features(vit, model, x, e)  # current shared U's, experience e's specific adapters
            rows = model.experiences.rows(e)
            protos = model.experiences.prototypes[rows]
            cos = (f @ protos.T) / (f.norm(dim=1, keepdim=True) * protos.norm(dim=1))
            expected[:, model.experiences.class_ids(e)] = cos
            full.append(model.experience_features(x, e))  # t + 1 full forwards
        got = model(x)
    torch.testing.assert_close(got, expected)
    shortcut = torch.cat([F.normalize(full[e], dim=1) @ F.normalize(
        model.experiences.prototypes[model.experiences.rows(e)], dim=1).T for e in range(3)], dim=1)
    assert torch.equal(got[:, [c for e in range(3) for c in model.experiences.class_ids(e)]], shortcut)
    assert stream_metric(strategy.eval(benchmark.test_stream), "Top1_Acc") > 0.5


def test_a_class_of_several_experiences_scores_its_best_prototype():
    """Domain stream (memo §2.5): a prototype per (class, experience), each in its experience's network;
    the class's logit is the best of its pairs."""
    vit, benchmark = vit64(), domain_stream(num_domains=2, per_class=8)
    strategy = strategy64(vit, train_epochs=2)
    for experience in benchmark.train_stream:
        strategy.train(experience)
    model = strategy.model.eval()
    assert model.experiences.row_classes.tolist() == [0, 1, 2, 0, 1, 2]
    x = torch.stack([sample[0] for sample in benchmark.test_stream[0].dataset]).double()
    with torch.no_grad():
        per_experience = []
        for e in range(2):
            f = merged_features(vit, model, x, e)
            protos = model.experiences.prototypes[model.experiences.rows(e)]
            per_experience.append((f @ protos.T) / (f.norm(dim=1, keepdim=True) * protos.norm(dim=1)))
        torch.testing.assert_close(model(x), torch.maximum(*per_experience))


class EpochRates(SupervisedPlugin):
    def __init__(self):
        super().__init__()
        self.rates = []

    def before_training_epoch(self, strategy, **kwargs):
        self.rates.append(strategy.optimizer.param_groups[0]["lr"])


def test_the_rate_anneals_per_epoch_as_cosine_annealing_lr():
    rates = EpochRates()
    strategy = strategy64(vit64(), train_epochs=4, plugins=[rates], lr=0.03)
    benchmark = stream64()
    for experience in benchmark.train_stream:
        strategy.train(experience)
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.03)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=4, eta_min=0)
    expected = []
    for _ in range(4):
        expected.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates.rates == pytest.approx(expected * 2, rel=1e-12)  # restarted in each experience


# ---------------------------------------------------------------------- the strategy: options, files, resume

import drop_in_cases as cases  # noqa: E402
from lora_sum_cases import (check_dtype, check_loader_options_reach_every_loader,  # noqa: E402
                            check_model_and_config_first_without_warnings, check_pretrained_round_trip,
                            check_resume_equals_uninterrupted, check_signature_agrees_with_config)

FAST = dict(rank=2, train_epochs=3, train_mb_size=16, eval_mb_size=64, lr=0.05)


def test_signature_agrees_with_config():
    check_signature_agrees_with_config(CLLoRA, CLLoRAConfig)
    assert CLLoRAConfig() == CLLoRAConfig(rank=8, lr=0.03, momentum=0.9, weight_decay=1e-4, train_mb_size=64,
                                          train_epochs=30, kd_weight=5.0, kd_temperature=2.0, ortho_weight=1e-4)


@pytest.mark.parametrize("name, value, allowed", [
    ("rank", 0, "integer >= 1"), ("lr", -1.0, "number > 0"), ("shared_blocks", -1, "integer >= 0"),
    ("kd_temperature", 0.0, "number > 0"), ("ortho_weight", -1.0, "number >= 0"), ("num_workers", -1, "integer >= 0")])
def test_bad_options_are_refused_by_name(name, value, allowed):
    with pytest.raises(ValueError, match=rf"{name} must .*{allowed}.*got {value!r}"):
        CLLoRA(cases.tiny_vit(), **{name: value})


def test_what_cannot_work_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="shared_blocks must leave at least one task-specific block of the ViT's 2, "
                                         "got shared_blocks=2"):
        CLLoRA(cases.tiny_vit(), shared_blocks=2)
    with pytest.raises(ValueError, match="precision must be '32-true' or 'bf16-mixed' for CL-LoRA"):
        CLLoRA(cases.tiny_vit(), precision="16-mixed")
    with pytest.raises(TypeError, match=r"takes no optimiser object as optimizer=, got SGD; set lr, momentum, "
                                        r"weight_decay"):
        CLLoRA(cases.tiny_vit(), optimizer=torch.optim.SGD(cases.tiny_vit().parameters(), lr=0.1))
    with pytest.raises(TypeError, match="VisionTransformer"):
        CLLoRA(torch.nn.Linear(3, 3))
    from avalanche.training.plugins import LRSchedulerPlugin, ReplayPlugin

    with pytest.raises(ValueError, match="cannot use ReplayPlugin: the method is rehearsal-free"):
        CLLoRA(cases.tiny_vit(), plugins=[ReplayPlugin(mem_size=10)])
    scheduler = torch.optim.lr_scheduler.StepLR(torch.optim.SGD(cases.tiny_vit().parameters(), lr=0.1), 1)
    with pytest.raises(ValueError, match="cannot use LRSchedulerPlugin: the strategy builds a fresh SGD"):
        CLLoRA(cases.tiny_vit(), plugins=[LRSchedulerPlugin(scheduler)])
    ready = CLLoRA(cases.tiny_vit(), rank=2).model
    with pytest.raises(ValueError, match=r"leave \['rank'\] unset \(the model's: rank=2\)"):
        CLLoRA(ready, rank=3)


def test_resume_after_a_crash_mid_experience_equals_the_uninterrupted_run(tmp_path):
    check_resume_equals_uninterrupted(CLLoRA, tmp_path, lr=0.05)


def test_save_pretrained_from_pretrained_predicts_identically(tmp_path):
    check_pretrained_round_trip(CLLoRA, CLLoRAViT, tmp_path)


def test_the_model_and_the_config_come_first_silently():
    check_model_and_config_first_without_warnings(CLLoRA, CLLoRAViT)


def test_loader_options_reach_every_loader(monkeypatch):
    check_loader_options_reach_every_loader(CLLoRA, monkeypatch)


@pytest.mark.parametrize("stream", ["nc_benchmark", "ni_benchmark", "tensors_benchmark", "task_incremental_benchmark"])
def test_learns_avalanche_streams(stream, tmp_path):
    strategy = CLLoRA(cases.tiny_vit(), evaluator=cases.quiet_evaluator(), **FAST)
    assert cases.train_stream_and_eval(strategy, cases.STREAMS[stream](tmp_path)) > cases.LEARNED


def test_online_stream_with_task_boundaries_trains_one_experience_per_experience(tmp_path):
    chunks, test_stream = cases.online(tmp_path, access_task_boundaries=True)
    strategy = CLLoRA(cases.tiny_vit(), evaluator=cases.quiet_evaluator(), **FAST)
    for chunk in chunks:
        strategy.train(chunk)
    assert strategy.model.num_experts == 2 and strategy.model.experiences.finished.tolist() == [True, True]
    assert cases.stream_accuracy(strategy.eval(test_stream), test_stream) > cases.LEARNED


def test_bf16_mixed_trains_and_keeps_the_trained_weights_float32():
    strategy = CLLoRA(cases.tiny_vit(), evaluator=cases.quiet_evaluator(), precision="bf16-mixed", **FAST)
    benchmark = class_stream(num_experiences=2, per_class=8)
    for experience in benchmark.train_stream:
        strategy.train(experience)
    assert {p.dtype for p in strategy.model.parameters()} == {torch.float32}
    assert stream_metric(strategy.eval(benchmark.test_stream), "Top1_Acc") > 0.5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_backbone_dtype(dtype, tmp_path):
    check_dtype(CLLoRA, dtype, tmp_path, trained=trained_dtype(dtype))  # float32 beside a narrow ViT


def test_periodic_evaluation_inside_an_experience_scores_the_finished_ones_only():
    benchmark = class_stream(num_experiences=2, per_class=8)
    strategy = CLLoRA(cases.tiny_vit(), evaluator=cases.quiet_evaluator(), eval_every=1, **FAST)
    for experience in benchmark.train_stream:
        strategy.train(experience, eval_streams=[benchmark.test_stream])
    assert strategy.model.experiences.finished.tolist() == [True, True]
