"""SD-LoRA's own mechanics: frozen directions, learning magnitudes (tiny ViTs, CPU, seconds; what it shares
with InfLoRA: test_lora_sum.py)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from avalanche.core import SupervisedPlugin
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from avalanche_color import SDLoRA
from avalanche_color.peers.sd_lora.model import SDLoRAViT
from lora_sum_cases import tiny, trained_counts
from drop_in_cases import tiny_vit
from streams import class_stream

pytestmark = pytest.mark.usefixtures("one_thread")


def test_earlier_directions_stay_bit_identical_while_their_magnitudes_learn():
    strategy = tiny(SDLoRA)
    stream = class_stream(num_experiences=3, per_class=8).train_stream
    strategy.train(stream[0])
    first = {k: v.clone() for k, v in strategy.model.state_dict().items() if ".components.0." in k}
    magnitudes = [float(strategy.model.magnitudes[0].detach())]
    for experience in stream[1:]:
        strategy.train(experience)
        magnitudes.append(float(strategy.model.magnitudes[0].detach()))
        for key, value in first.items():
            assert torch.equal(strategy.model.state_dict()[key], value), key
    assert len(set(magnitudes)) == 3  # alpha_1 changed in each later experience
    assert strategy.model.finished.tolist() == [True, True, True]


PAPERS_READING = dict(direction_norm="product", normalise_when="finish", earlier_magnitudes="keep")


def formula_logits(vit: VisionTransformer, model, x: torch.Tensor, *, normalised: list[bool],
                   norm: str) -> torch.Tensor:
    """The network written out from the authors' ``_LoRA_qkv_timm_train``, merged into a copy of ``vit``:
    q and v of every block get ``alpha_i B_i A_i``, divided by ``||B_i|| ||A_i||`` (or, the paper's notation,
    ``||B_i A_i||``) where ``normalised[i]``; then the one head over the classes trained so far."""
    reference = copy.deepcopy(vit)
    alphas = [m.detach() for m in model.magnitudes]
    for block, layer in zip(reference.blocks, model.layers):
        width = layer.width
        weight = block.attn.qkv.weight.detach().clone()
        for i, component in enumerate(layer.components):
            for index, rows in ((0, slice(0, width)), (1, slice(2 * width, 3 * width))):  # q, v
                A, B = component.A[index].detach(), component.B[index].detach()
                update = alphas[i] * B @ A
                if normalised[i]:
                    scale = (torch.linalg.matrix_norm(B) * torch.linalg.matrix_norm(A) if norm == "factors"
                             else torch.linalg.matrix_norm(B @ A))
                    update = update / scale
                weight[rows] += update
        block.attn.qkv.weight = nn.Parameter(weight)
    features = reference.forward_head(reference.forward_features(x), pre_logits=True)
    logits = features @ model.head_weight.detach().T + model.head_bias.detach()
    return logits.masked_fill(~model.trained_classes, float("-inf"))


class FormulaCheck(SupervisedPlugin):
    """The magnitudes each experience starts from, and how far the model is from the formula at the
    start of each experience's training, after its first epoch (mid-experience) and after it."""

    def __init__(self, vit: VisionTransformer, x: torch.Tensor, newest_normalised_after_finish: bool,
                 norm: str) -> None:
        super().__init__()
        self.vit, self.x, self.newest, self.norm = vit, x, newest_normalised_after_finish, norm
        self.starting_magnitudes: list[list[float]] = []
        self.gaps: list[float] = []

    def gap(self, model, normalised: list[bool]) -> float:
        with torch.no_grad():
            got = model(self.x)[:, : len(model.trained_classes)]
            expected = formula_logits(self.vit, model, self.x, normalised=normalised, norm=self.norm)
        assert torch.equal(torch.isinf(got), torch.isinf(expected))
        return float((got - expected)[torch.isfinite(expected)].abs().max())

    def earlier_normalised(self, model) -> list[bool]:
        return [i < model.num_experts - 1 for i in range(model.num_experts)]

    def before_training_exp(self, strategy, **kwargs):
        self.starting_magnitudes.append([float(m.detach()) for m in strategy.model.magnitudes])
        self.gaps.append(self.gap(strategy.model, self.earlier_normalised(strategy.model)))

    def after_training_epoch(self, strategy, **kwargs):
        if strategy.clock.train_exp_epochs == 1:
            self.gaps.append(self.gap(strategy.model, self.earlier_normalised(strategy.model)))

    def after_training_exp(self, strategy, **kwargs):
        model = strategy.model.eval()
        normalised = [True] * model.num_experts if self.newest else self.earlier_normalised(model)
        self.gaps.append(self.gap(model, normalised))
        model.train()


@pytest.mark.parametrize("reading", ["code", "paper"])
def test_the_trained_and_the_evaluated_network_are_the_formula(reading):
    # The code (default): during experience t and at its evaluation,
    #   W0 x + sum_{i<t} a_i B_i A_i x / (||B_i|| ||A_i||) + a_t B_t A_t x,
    # every a_i restarting at 0.8 when experience t starts. The paper's reading (an option): every finished
    # direction divided by ||B_i A_i|| as soon as it finishes, magnitudes continuing from their values.
    options = {} if reading == "code" else PAPERS_READING
    vit = tiny_vit(0).double()
    stream = class_stream(num_experiences=3, per_class=8)
    x = torch.stack([stream.test_stream[e].dataset[i][0] for e in range(3) for i in range(3)]).double()
    check = FormulaCheck(vit, x, newest_normalised_after_finish=reading == "paper",
                         norm="factors" if reading == "code" else "product")
    strategy = tiny(SDLoRA, vit=copy.deepcopy(vit), plugins=[check], **options)
    for experience in stream.train_stream:
        strategy.train(experience)
    assert len(check.gaps) == 9
    assert max(check.gaps) < 1e-10, check.gaps
    if reading == "code":
        assert check.starting_magnitudes == [[0.8], [0.8, 0.8], [0.8, 0.8, 0.8]]
    else:
        assert check.starting_magnitudes[1][0] != 0.8 and check.starting_magnitudes[2][1] != 0.8  # kept


def test_a_reloaded_model_scores_the_network_as_trained(tmp_path):
    # The newest direction stays as trained after save and load; a folder saved before normalise_when
    # existed (normalised when finished) keeps that meaning.
    for options in ({}, PAPERS_READING):
        strategy = tiny(SDLoRA, **options)
        stream = class_stream(num_experiences=2, per_class=8)
        for experience in stream.train_stream:
            strategy.train(experience)
        model = strategy.model.eval()
        x = torch.stack([stream.test_stream[1].dataset[i][0] for i in range(4)])
        folder = model.save_pretrained(tmp_path / str(len(options)))
        if options:  # as an older version wrote it: without these options, nor a copy of the config in the weights
            from safetensors.torch import load_file, save_file

            from avalanche_color.experts.saved import file_record

            weights = folder / "weights.safetensors"
            save_file(load_file(str(weights)), str(weights))
            config = json.loads((folder / "config.json").read_text())
            del config["options"]["normalise_when"], config["options"]["earlier_magnitudes"]
            config["files"] = {weights.name: file_record(weights.read_bytes())}
            (folder / "config.json").write_text(json.dumps(config))
            with pytest.warns(UserWarning, match="without a copy of config.json in weights.safetensors"):
                loaded = SDLoRAViT.from_pretrained(folder, tiny_vit(0))
        else:
            loaded = SDLoRAViT.from_pretrained(folder, tiny_vit(0))
        assert torch.equal(loaded(x), model(x))
        assert loaded.config.normalise_when == ("finish" if options else "next_experience")


def test_trainable_parameters_per_experience_equal_the_formula():
    # Experience t (0-based), depth L, width d, rank r_t, classes seen C_t:
    # A and B of q and v in every block, 2 L r_t (d + d); t + 1 magnitudes; the head (d + 1) C_t.
    depth, d, classes = 2, 32, 2
    counts = trained_counts(SDLoRA, rank_schedule=(3, 2))
    ranks = [3, 2, 2]
    assert counts == [2 * depth * r * (d + d) + (t + 1) + (d + 1) * classes * (t + 1) for t, r in enumerate(ranks)]


def test_what_trains_is_declared_not_read_back_from_requires_grad():
    # A user's model.requires_grad_(True) changes neither the computation nor what the optimiser gets.
    strategy = tiny(SDLoRA)
    stream = class_stream(num_experiences=2, per_class=8).train_stream
    for experience in stream:
        strategy.train(experience)
    model = strategy.model.eval()
    x = torch.stack([stream[1].dataset[i][0] for i in range(4)])
    declared = [id(p) for p in model.trainable_parameters()]
    before = model(x)
    model.requires_grad_(True)
    assert torch.equal(model(x), before)
    assert [id(p) for p in model.trainable_parameters()] == declared


@pytest.mark.parametrize("options", [{}, PAPERS_READING], ids=["code", "paper"])
def test_a_direction_finished_before_it_learned_adds_nothing_instead_of_nan(options):
    # EarlyStoppingPlugin may restore an experience's first state (B = 0) and stop: the normalised
    # direction B A / (||B|| ||A||) is then 0 / 0; it must add nothing, not turn every logit into NaN.
    strategy = tiny(SDLoRA, **options)
    stream = class_stream(num_experiences=2, per_class=8)
    strategy.train(stream.train_stream[0])
    model = strategy.model.eval()
    x = torch.stack([stream.test_stream[0].dataset[i][0] for i in range(4)])
    model.learn_classes([2, 3])  # a second component, B = 0, finished without any training
    model.finish_component()
    before = model(x)
    model.learn_classes([4, 5])  # a third: the code normalises the second now
    model.finish_component()
    after = model(x)
    assert torch.isfinite(before[:, :2]).all() and torch.isfinite(after[:, :2]).all()
    torch.testing.assert_close(after[:, :2], before[:, :2])  # the unlearned direction changes nothing


def test_new_head_rows_are_initialised_as_the_codes_simple_linear():
    # SimpleLinear: kaiming_uniform_(nonlinearity="linear"), bound sqrt(3 / width), bias 0;
    # nn.Linear's: 1 / sqrt(width).
    width = 32
    for head_init, bound, zero_bias in (("kaiming", (3 / width) ** 0.5, True), ("linear", width ** -0.5, False)):
        model = tiny(SDLoRA, head_init=head_init).model
        model.learn_classes(list(range(200)))
        weight = model.head_weight.detach()
        assert weight.abs().max() <= bound and weight.abs().max() > 0.95 * bound, head_init
        assert bool((model.head_bias == 0).all()) == zero_bias


def test_a_finished_component_keeps_no_gradient():
    # Its last gradients would double its memory for the rest of the stream (CoLoR's experts drop theirs too).
    strategy = tiny(SDLoRA)
    stream = class_stream(num_experiences=2, per_class=8).train_stream
    for experience in stream:
        strategy.train(experience)
    first = strategy.model.layers[0].components[0]
    assert first.A.grad is None and first.B.grad is None
    assert not first.A.requires_grad
