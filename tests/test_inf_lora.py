"""InfLoRA's own mechanics: branches designed outside earlier tasks' inputs (tiny ViTs, CPU; what it shares with
SD-LoRA: test_lora_sum.py)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from avalanche.core import SupervisedPlugin

from avalanche_color import InfLoRA, InfLoRAConfig, InfLoRAViT
from avalanche_color.peers.inf_lora.model import ProtectedSubspace
from avalanche_color.peers.lora_sum.model import input_covariances
from helpers import LearningRates
from lora_sum_cases import tiny, trained_counts
from drop_in_cases import tiny_vit
from streams import class_stream

pytestmark = pytest.mark.usefixtures("one_thread")


def test_threshold_rises_as_the_codes_lamb_to_lame():
    config = InfLoRAConfig(threshold=0.95, final_threshold=1.0, num_experiences=10)
    assert [config.threshold_at(t) for t in (0, 5, 10)] == pytest.approx([0.95, 0.975, 1.0])
    assert InfLoRAConfig(threshold=0.9).threshold_at(7) == 0.9


def covariance(model: InfLoRAViT, experience, layer: int) -> torch.Tensor:
    images = torch.stack([sample[0] for sample in experience.dataset])
    with torch.no_grad(), input_covariances(model.layers) as sums:
        model.features(images)
    return sums[layer].mean()


@pytest.mark.parametrize("layer", [0, 1])
def test_a_later_branch_leaves_the_layer_output_unchanged_on_protected_inputs(layer):
    strategy = tiny(InfLoRA, threshold=0.9)
    stream = class_stream(num_experiences=3, per_class=8).train_stream
    qkv = strategy.model.layers[layer]
    for task, experience in enumerate(stream):
        protected = strategy.model.subspaces[layer].protected_basis().clone()  # for the earlier tasks
        strategy.train(experience)
        if task == 0:
            assert protected.shape[1] == 0
            continue
        assert 0 < protected.shape[1] < qkv.in_features
        x = (protected @ torch.randn(protected.shape[1], 50, dtype=torch.float64)).T.float()  # protected inputs
        other = torch.randn(50, qkv.in_features)
        update = qkv.delta_weight(task)  # (2, d, d): the branch's k and v updates
        assert float(update.abs().max()) > 0  # the branch learned something
        changed = torch.linalg.matrix_norm(other @ update.transpose(1, 2))
        unchanged = torch.linalg.matrix_norm(x @ update.transpose(1, 2))
        assert bool((unchanged <= 1e-5 * changed).all()), (unchanged, changed)


def test_the_protected_subspace_keeps_the_threshold_of_each_later_task_inputs():
    threshold = 0.9
    strategy = tiny(InfLoRA, threshold=threshold)
    stream = class_stream(num_experiences=3, per_class=8).train_stream
    for task, experience in enumerate(stream):
        strategy.train(experience)
        subspace = strategy.model.subspaces[0]
        basis = subspace.protected_basis()
        R = covariance(strategy.model, experience, 0).double()
        kept = torch.linalg.matrix_norm(basis @ (basis.T @ R)) ** 2 / torch.linalg.matrix_norm(R) ** 2
        if task == 0:  # the code's first-task rule: the directions whose cumulative share stays below epsilon
            assert 0 < float(kept) < threshold + 1e-9
        else:  # later tasks add directions until the protected share reaches epsilon (DualGPM, Eq-9)
            assert float(kept) >= threshold - 1e-6


def test_dualgpm_switches_to_the_complement_past_half_the_width():
    subspace = ProtectedSubspace(8)
    generator = torch.Generator().manual_seed(0)
    X = torch.randn(8, 100, generator=generator, dtype=torch.float64)
    subspace.update(X @ X.T / 100, threshold=0.99)  # nearly isotropic inputs: most directions kept
    assert bool(subspace.retain) and subspace.basis.shape[1] < 4
    protected = subspace.protected_basis()
    torch.testing.assert_close(protected.T @ subspace.basis, torch.zeros(protected.shape[1], subspace.basis.shape[1],
                                                                         dtype=torch.float64))
    torch.testing.assert_close(subspace.free_projector() @ protected, torch.zeros_like(protected))


def test_trainable_parameters_per_experience_equal_the_formula():
    # Experience t (0-based), depth L, width d, rank r, classes seen C_t: B of k and v in every block,
    # 2 L d r (A_t is designed, not trained); the head (d + 1) C_t.
    depth, d, rank, classes = 2, 32, 3, 2
    counts = trained_counts(InfLoRA, rank=rank)
    assert counts == [2 * depth * d * rank + (d + 1) * classes * (t + 1) for t in range(3)]


def test_frozen_branches_folded_into_the_weight_compute_what_the_low_rank_path_computes():
    from avalanche_color.peers.lora_sum.model import LoRASumQKV, Mixing

    torch.manual_seed(0)
    layer = LoRASumQKV(torch.nn.Linear(16, 48), ("k", "v"))
    for _ in range(3):
        torch.nn.init.normal_(layer.add_component(2).B)
    x = torch.randn(4, 5, 16)
    low_rank = layer(x, Mixing(low_rank=frozenset(range(3))))  # each branch runs down and up
    base = layer.base_layer(x)
    merged = layer(x)  # all folded: one matmul with W + sum B A
    assert torch.equal(layer(x, Mixing(low_rank=frozenset({5}))), merged)  # what runs low-rank is the argument alone
    layer.components.requires_grad_(False)
    with torch.no_grad():  # neither requires_grad nor the grad mode changes the computation
        assert torch.equal(layer(x, Mixing(low_rank=frozenset(range(3)))), low_rank)
    torch.testing.assert_close(merged, low_rank, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(merged[..., :16], base[..., :16])  # q is not adapted
    assert (merged[..., 16:] - base[..., 16:]).abs().max() > 0.1  # k and v are


def test_the_codes_epoch_cosine_holds_each_epochs_rate_one_epoch_late_as_the_code_runs_it():
    # InfLoRA's CosineSchedule, stepped per epoch after its constructor's step(0) and last_epoch = -1:
    # epochs 0 and 1 at lr, epoch e >= 1 of E at lr cos(99 pi (e - 1) / (200 (E - 1))), per experience.
    rates = LearningRates()
    strategy = tiny(InfLoRA, lr_schedule="epoch_cosine", train_epochs=3, lr=0.01, plugins=[rates],
                    num_experiences=2)
    for experience in class_stream(num_experiences=2, per_class=20).train_stream:
        strategy.train(experience)
    expected = [0.01 * math.cos(99 * math.pi * max(e - 1, 0) / 400) for e in range(3)]
    for experience in range(2):
        for epoch in range(3):
            (rate,) = set(rates.seen[(experience, epoch)])  # one rate through the epoch
            assert rate == pytest.approx(expected[epoch])
    assert expected[0] == expected[1] == 0.01 and expected[-1] / 0.01 == pytest.approx(0.7126, abs=1e-4)


def inf_lora_formula_logits(vit, model, x: torch.Tensor) -> torch.Tensor:
    """The network written out from the authors' ``Attention_LoRA``: k and v of every block get
    ``sum_t B_t A_t`` (each branch's own B, one A for k and v), merged into a copy of ``vit``; one head."""
    reference = copy.deepcopy(vit)
    for block, layer in zip(reference.blocks, model.layers):
        width = layer.width
        weight = block.attn.qkv.weight.detach().clone()
        for component in layer.components:
            for index, rows in ((0, slice(width, 2 * width)), (1, slice(2 * width, 3 * width))):  # k, v
                weight[rows] += component.B[index].detach() @ component.A[index].detach()
        block.attn.qkv.weight = torch.nn.Parameter(weight)
    features = reference.forward_head(reference.forward_features(x), pre_logits=True)
    logits = features @ model.head_weight.detach().T + model.head_bias.detach()
    return logits.masked_fill(~model.trained_classes, float("-inf"))


class InfLoRAFormulaCheck(SupervisedPlugin):
    """The gap to the formula after each experience's first epoch and after the experience."""

    def __init__(self, vit, x: torch.Tensor) -> None:
        super().__init__()
        self.vit, self.x, self.gaps = vit, x, []

    def gap(self, model) -> float:
        with torch.no_grad():
            got = model(self.x)[:, : len(model.trained_classes)]
            expected = inf_lora_formula_logits(self.vit, model, self.x)
        assert torch.equal(torch.isinf(got), torch.isinf(expected))
        return float((got - expected)[torch.isfinite(expected)].abs().max())

    def after_training_epoch(self, strategy, **kwargs):
        if strategy.clock.train_exp_epochs == 1:
            self.gaps.append(self.gap(strategy.model))

    def after_training_exp(self, strategy, **kwargs):
        self.gaps.append(self.gap(strategy.model.eval()))
        strategy.model.train()


def test_the_trained_and_the_evaluated_network_are_the_formula_and_the_first_a_is_the_codes_design():
    # During and after every experience: W0 + sum_t B_t A_t on k and v (coefficient 1); the first A_0 of a
    # layer spans the top-r left singular vectors of that layer's input sum x x^T over the experience's
    # training tokens, scaled by 1/sqrt(3) (methods/inflora.py, task 0: U[:, :rank].T / sqrt(3)).
    vit = tiny_vit(0).double()
    stream = class_stream(num_experiences=3, per_class=8)
    x = torch.stack([stream.test_stream[e].dataset[i][0] for e in range(3) for i in range(3)]).double()
    check = InfLoRAFormulaCheck(vit, x)
    strategy = tiny(InfLoRA, vit=copy.deepcopy(vit), plugins=[check], num_experiences=3, lr=0.01)
    strategy.train(stream.train_stream[0])
    images = torch.stack([sample[0] for sample in stream.train_stream[0].dataset]).double()
    with torch.no_grad():
        tokens = vit.norm_pre(vit._pos_embed(vit.patch_embed(images)))
        inputs = vit.blocks[0].norm1(tokens).reshape(-1, tokens.shape[-1])
    U = torch.linalg.svd(inputs.T @ inputs)[0][:, :2]  # rank 2
    A = strategy.model.layers[0].components[0].A[0]
    torch.testing.assert_close(A.T @ A, U @ U.T / 3)  # the same span and scale, whatever the signs
    for experience in stream.train_stream[1:]:
        strategy.train(experience)
    assert len(check.gaps) == 6 and max(check.gaps) < 1e-10, check.gaps
