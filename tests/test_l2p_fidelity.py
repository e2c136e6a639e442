"""L2P against Avalanche's own ``LearningToPrompt`` and what L2P's authors' code (google-research/l2p) adds.

The package's ``L2P`` and Avalanche's ``LearningToPrompt`` (avalanche-lib 0.6) are trained side by
side on the same tiny ViT, pool, keys, head and batches, and must give the same logits after every
experience (to float rounding) and the same accuracy matrix. Avalanche's needs a shim inside these
tests only: its ``model_name`` registry (``avalanche/models/vit.py``) knows only 224 px ViTs built
through timm 0.x's ``_create_vision_transformer`` (under timm 1.x it fails: ``PretrainedCfg`` is not
subscriptable), and it replaces the head by a 768-wide ``nn.Linear``; here a registered name builds
its ``ViTWithPrompt`` at the tiny ViT's size, and its head is replaced by one of the tiny ViT's width.

Three things keep the two from agreeing as they come, each set aside here and checked where it can be:
its ViT has a position embedding for the prompt tokens (zeroed: ours and L2P's authors' code give
the prompts none); its head has a row for every class from the start and never masks a class at
evaluation (ours grows rows as classes come and gives untrained classes -inf: here ours starts with
every class, so the whole logits compare); and its batchwise vote breaks equal counts with
``torch.topk`` (no order guaranteed) where L2P's code and ours take the lower id (the streams here
have no such tie, which the test checks).

Then the options that restore L2P's code (gradient clipping, batchwise selection, the learning rate
scaled by batch / 256) are checked by their properties.
"""

import math
from collections import Counter

import avalanche.models.vit as avalanche_vits
import pytest
import torch
from avalanche.core import SupervisedPlugin
from avalanche.models.timm_vit import ViTWithPrompt
from avalanche.training.supervised.l2p import LearningToPrompt
from torch import nn

from avalanche_color import L2P, L2PViT, PromptPool
from avalanche_color.peers.l2p.model import majority_selection
from helpers import quiet_evaluator
from streams import class_stream, tiny_vit

POOL = dict(pool_size=10, prompt_length=2, top_n=3)
NUM_CLASSES = 4  # class_stream(): two experiences of two classes
BUDGET = dict(lr=0.01, train_mb_size=16, train_epochs=4, eval_mb_size=16)
# Our head_input and Avalanche's head_type that read the same outputs.
HEAD_TYPES = {"prompts": "prompt", "pooled": "token"}
TINY_NAME = "tiny_vit_16px"  # the name registered for Avalanche's create_model


def images(count=6, seed=0):
    return torch.randn(count, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------- Avalanche's LearningToPrompt, shimmed


@pytest.fixture
def tiny_avalanche_vit(monkeypatch):
    """Register a ``model_name`` that builds Avalanche's ``ViTWithPrompt`` at the tiny ViT's size."""

    def build(pretrained=False, **options):
        return ViTWithPrompt(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, **options)

    monkeypatch.setattr(avalanche_vits, TINY_NAME, build, raising=False)  # create_model looks in globals()
    return TINY_NAME


class Recorder(SupervisedPlugin):
    """Each training batch's images; each evaluation's outputs and labels, per experience evaluated."""

    def __init__(self):
        super().__init__()
        self.batches, self.outputs, self.labels = [], {}, {}

    def after_training_iteration(self, strategy, **kwargs):
        self.batches.append(strategy.mb_x.clone())

    def after_eval_iteration(self, strategy, **kwargs):
        experience = strategy.experience.current_experience
        self.outputs.setdefault(experience, []).append(strategy.mb_output.detach())
        self.labels.setdefault(experience, []).append(strategy.mb_y)


class Votes(SupervisedPlugin):
    """For each batch L2P sees (training and evaluation): whether its samples' own selections differ
    (so a batchwise vote changes something), and whether the vote has equal counts across the top_n
    boundary: there L2P's code (``jax.lax.top_k``: the lower id first) and Avalanche's port
    (``torch.topk``: no order among equal values; on CPU often the higher id) may choose differently."""

    def __init__(self):
        super().__init__()
        self.batches = self.disagreeing = self.tied = 0

    def after_forward(self, strategy, **kwargs):
        model = strategy.model
        with torch.no_grad():
            own = model.pool.select(model.query(strategy.mb_x), model.config.top_n)
        counts = torch.bincount(own.flatten(), minlength=model.pool.pool_size).sort(descending=True).values
        self.batches += 1
        self.disagreeing += int(not (own == own[0]).all())
        self.tied += int(counts[own.shape[1] - 1] == counts[own.shape[1]])

    after_eval_forward = after_forward


class ClipAsL2PCode(SupervisedPlugin):
    """L2P's code's clipping (train_continual.py, train_step), written again for Avalanche's strategy:
    ``grad * min(1, max_norm / (l2 + 1e-6))`` with ``l2`` the global norm of the gradients."""

    def __init__(self, max_norm):
        super().__init__()
        self.max_norm, self.factors = max_norm, []

    def before_update(self, strategy, **kwargs):
        grads = [p.grad for p in strategy.model.parameters() if p.grad is not None]
        l2 = torch.sqrt(sum((g * g).sum() for g in grads))
        factor = torch.clamp(self.max_norm / (l2 + 1e-6), max=1.0)
        for g in grads:
            g.mul_(factor)
        self.factors.append(float(factor))


def avalanche_twin(ours: L2P, model_name: str, *, batchwise: bool, lr: float, plugins=()) -> LearningToPrompt:
    """Avalanche's ``LearningToPrompt`` holding ``ours``'s backbone, prompts, keys and head.

    Its ViT gives the prompt tokens a position embedding of their own; set to zero, the prompts get
    none, as in ours and in L2P's authors' code (its PyTorch ports give them [CLS]'s when they load
    pretrained weights; without, a random one).
    """
    config = ours.config
    theirs = LearningToPrompt(
        model_name=model_name, pretrained=False, num_classes=NUM_CLASSES, pool_size=config.pool_size,
        prompt_length=config.prompt_length, top_k=config.top_n, lr=lr, sim_coefficient=config.surrogate_weight,
        batchwise_prompt=batchwise, head_type=HEAD_TYPES[config.head_input], train_mb_size=config.train_mb_size,
        train_epochs=config.train_epochs, eval_mb_size=config.eval_mb_size, evaluator=quiet_evaluator(),
        plugins=list(plugins))
    model = ours.model
    backbone = model.backbone.state_dict()
    theirs.original_vit.load_state_dict(backbone)  # the query: the same ViT without prompts
    positions = backbone["pos_embed"]  # [CLS], then the patches
    prompts = positions.new_zeros(1, config.top_n * config.prompt_length, positions.shape[2])
    theirs.model.head = nn.Linear(model.head.in_features, NUM_CLASSES)  # Avalanche's is 768 wide
    theirs.model.load_state_dict({
        **backbone,
        "pos_embed": torch.cat((positions[:, :1], prompts, positions[:, 1:]), dim=1),
        "prompt.prompt": model.pool.prompts.detach(), "prompt.prompt_key": model.pool.keys.detach(),
        "head.weight": model.head.weight.detach(), "head.bias": model.head.bias.detach(),
    })
    return theirs


def ours_and_avalanches(tiny_vit_name, *, ours_options=None, twin_options=None):
    ours_recorder, their_recorder, votes = Recorder(), Recorder(), Votes()
    ours = L2P(tiny_vit(0), evaluator=quiet_evaluator(), plugins=[ours_recorder, votes],
               **{**POOL, **BUDGET, **(ours_options or {})})
    # Both heads start with rows for every class: Avalanche's has them from the start, ours grows
    # them at run time (drawing them from the RNG). With every class declared learnt, ours also gives
    # the classes not trained yet their logits at evaluation (it masks them by default), as Avalanche's.
    ours.model.learn_classes(range(NUM_CLASSES))
    twin_options = dict(twin_options)
    theirs = avalanche_twin(ours, tiny_vit_name, plugins=[their_recorder, *twin_options.pop("plugins", ())],
                            **twin_options)
    benchmark = class_stream()
    accuracies = {"ours": [], "theirs": []}
    for index, experience in enumerate(benchmark.train_stream):
        for name, strategy in (("ours", ours), ("theirs", theirs)):
            torch.manual_seed(index)  # the same shuffled batches
            strategy.train(experience)
            results = strategy.eval(benchmark.test_stream)
            accuracies[name].append([results[f"Top1_Acc_Exp/eval_phase/test_stream/Task000/Exp{e:03d}"]
                                     for e in range(len(benchmark.test_stream))])
    return ours_recorder, their_recorder, accuracies, votes


@pytest.mark.parametrize("ours_options", [{}, dict(batchwise_selection="always", head_input="pooled")],
                         ids=["defaults", "batchwise-cls-head"])
def test_l2p_computes_what_avalanches_learning_to_prompt_computes(tiny_avalanche_vit, ours_options, one_thread):
    """With the same ViT, pool, keys, head and batches, L2P and Avalanche's ``LearningToPrompt`` give
    the same logits on every test sample after each experience, so the same accuracy matrix.

    The defaults (each sample its own prompts, the head on the prompt outputs) against Avalanche's;
    ``batchwise_selection="always"`` against its ``batchwise_prompt=True`` (both vote in training
    and at evaluation), with the head on the [CLS] output (``head_input="pooled"``, its
    ``head_type="token"``): with one set of prompts per batch, a tiny random ViT's prompt outputs
    hardly depend on the image, so only that head learns in seconds. Where a batch's vote has equal
    counts across the top_n boundary, L2P's code and ours take the lower id, Avalanche's port any:
    these batches have no such tie (checked), so the two must agree.
    """
    batchwise = ours_options.get("batchwise_selection") == "always"
    ours, theirs, accuracies, votes = ours_and_avalanches(
        tiny_avalanche_vit, ours_options=ours_options, twin_options=dict(batchwise=batchwise, lr=BUDGET["lr"]))
    assert len(ours.batches) == len(theirs.batches) == 2 * 4 * 3  # experiences x epochs x batches (16, 16, 8)
    for mine, their in zip(ours.batches, theirs.batches):
        assert torch.equal(mine, their)
    assert ours.outputs.keys() == theirs.outputs.keys() == {0, 1}
    for experience in ours.outputs:
        mine, their = torch.cat(ours.outputs[experience]), torch.cat(theirs.outputs[experience])
        assert mine.shape == their.shape == (2 * 2 * 20, NUM_CLASSES)  # 2 evaluations x 2 classes x 20
        torch.testing.assert_close(mine, their, rtol=1e-4, atol=1e-4)
    assert accuracies["ours"] == accuracies["theirs"]
    # Among the classes trained (ours by default gives the others -inf, Avalanche's does not): after
    # the first experience, its test samples are told apart better than by chance, not perfectly.
    first = torch.cat(ours.outputs[0])[:40, :2].argmax(dim=1)
    assert 0.5 < float((first == torch.cat(ours.labels[0])[:40]).float().mean()) < 1
    assert votes.batches == 2 * 4 * 3 + 2 * 2 * 3  # training; 2 evaluations of 2 experiences, 3 batches each
    if batchwise:
        assert votes.disagreeing > 0 and votes.tied == 0  # the vote mattered, and never met a tie


def test_l2p_with_its_codes_options_computes_what_avalanches_does_with_them(tiny_avalanche_vit, one_thread):
    """All three options of L2P's code, against Avalanche's ``LearningToPrompt`` with batchwise prompts,
    the learning rate scaled by batch / 256 and the code's clipping rule written again as a plugin.

    L2P's code takes the clipping norm over the gradients of all its parameters, the frozen ViT's
    too (it freezes by a zero learning rate, train_continual.py ``create_optimizer``); both here
    take it over the parameters that train, whose gradients are the only ones computed.
    """
    clip = ClipAsL2PCode(max_norm=0.5)
    scaled_lr = 0.1  # Adam runs with 0.1 * 16 / 256
    ours, theirs, accuracies, votes = ours_and_avalanches(
        tiny_avalanche_vit,
        ours_options=dict(batchwise_selection="always", head_input="pooled", grad_clip_norm=0.5,
                          lr_batch_scaling=True, lr=scaled_lr),
        twin_options=dict(batchwise=True, lr=scaled_lr * BUDGET["train_mb_size"] / 256, plugins=[clip]))
    assert min(clip.factors) < 1 and max(clip.factors) == 1  # clipping acted on some updates, not all
    assert votes.disagreeing > 0 and votes.tied == 0
    for experience in ours.outputs:
        torch.testing.assert_close(torch.cat(ours.outputs[experience]), torch.cat(theirs.outputs[experience]),
                                   rtol=1e-4, atol=1e-4)
    assert accuracies["ours"] == accuracies["theirs"]


# ---------------------------------------------------------------------- batchwise selection


def majority_by_hand(selection, top_n):
    """L2P's code's rule: the ids by count, most first, the lower id first among equal counts."""
    counts = Counter(selection.flatten().tolist())
    return sorted(counts, key=lambda prompt: (-counts[prompt], prompt))[:top_n]


@pytest.mark.parametrize("seed", range(5))
def test_majority_selection_is_the_batchs_most_frequent_prompts(seed):
    generator = torch.Generator().manual_seed(seed)
    selection = torch.stack([torch.randperm(8, generator=generator)[:3] for _ in range(5)])
    majority = majority_selection(selection, pool_size=8)
    assert majority.shape == (5, 3)
    assert all(row == majority_by_hand(selection, 3) for row in majority.tolist())


def test_majority_selection_breaks_ties_towards_the_lower_index():
    assert majority_selection(torch.tensor([[3, 2], [1, 0]]), pool_size=4).tolist() == [[0, 1], [0, 1]]
    assert majority_selection(torch.tensor([[3, 2], [3, 1]]), pool_size=4).tolist() == [[3, 1], [3, 1]]


@torch.no_grad()
def test_batchwise_selection_gives_every_sample_the_batchs_most_frequent_prompts():
    x = images(8)
    per_sample = L2PViT(tiny_vit(), **POOL).select_prompts(x)[1]
    assert len({tuple(row) for row in per_sample.tolist()}) > 1  # the samples disagree: the vote decides
    expected = majority_by_hand(per_sample, POOL["top_n"])

    always = L2PViT(tiny_vit(), **POOL, batchwise_selection="always")
    training = L2PViT(tiny_vit(), **POOL, batchwise_selection="training")
    for model in (always.train(), always.eval(), training.train()):
        assert model.select_prompts(x)[1].tolist() == [expected] * 8
    assert torch.equal(training.eval().select_prompts(x)[1], per_sample)  # per sample at evaluation

    always.learn_classes([0, 1])
    logits = always.eval()(x)
    torch.testing.assert_close(logits, always(x, torch.tensor([expected] * 8)))
    # A sample's prediction depends on its batch: alone, it uses its own prompts.
    torch.testing.assert_close(always(x[:1]), always(x[:1], per_sample[:1]))


def test_batchwise_training_pulls_the_majority_keys_for_every_sample():
    seen = []

    class Selections(SupervisedPlugin):
        def after_forward(self, strategy, **kwargs):
            if strategy.is_training:
                seen.append(strategy.mb_selection.clone())

    strategy = L2P(tiny_vit(), evaluator=quiet_evaluator(), plugins=[Selections()], **POOL, **BUDGET,
                   batchwise_selection="always")
    strategy.train(class_stream().train_stream[0])
    assert len(seen) == 4 * 3
    for selection in seen:
        assert (selection == selection[0]).all()


# ---------------------------------------------------------------------- gradient clipping


class Gradients(SupervisedPlugin):
    """The trained parameters' gradients before and after the optimiser step's clipping."""

    def __init__(self):
        super().__init__()
        self.before, self.after = [], []

    @staticmethod
    def grads(strategy):
        return [p.grad.clone() for group in strategy.optimizer.param_groups for p in group["params"]]

    def before_update(self, strategy, **kwargs):
        self.before.append(self.grads(strategy))

    def after_update(self, strategy, **kwargs):
        self.after.append(self.grads(strategy))


def global_norm(grads):
    return math.sqrt(sum(float((g * g).sum()) for g in grads))


@pytest.mark.parametrize("bound", [None, 0.5])
def test_clipped_updates_never_exceed_the_bound_and_keep_their_direction(bound):
    recorder = Gradients()
    strategy = L2P(tiny_vit(), evaluator=quiet_evaluator(), plugins=[recorder], **POOL, **BUDGET,
                   grad_clip_norm=bound)
    strategy.train(class_stream().train_stream[0])
    norms = [global_norm(grads) for grads in recorder.before]
    assert len(norms) == 4 * 3 and min(norms) < 0.5 < max(norms)  # some updates need clipping, some not
    for before, after, norm in zip(recorder.before, recorder.after, norms):
        factor = 1.0 if bound is None else min(1.0, bound / (norm + 1e-6))
        for raw, used in zip(before, after):
            torch.testing.assert_close(used, raw * factor)
        if bound is not None:
            assert global_norm(after) <= bound * (1 + 1e-5)


# ---------------------------------------------------------------------- learning rate


@pytest.mark.parametrize("scaling, batch, expected", [(False, 16, 0.03), (True, 16, 0.03 * 16 / 256),
                                                       (True, 512, 0.03 * 2)])
def test_adams_learning_rate_is_lr_times_batch_over_256_with_lr_batch_scaling(scaling, batch, expected):
    strategy = L2P(tiny_vit(), evaluator=quiet_evaluator(), **POOL, lr=0.03, train_mb_size=batch, train_epochs=1,
                   lr_batch_scaling=scaling)
    strategy.train(class_stream().train_stream[0])
    [group] = strategy.optimizer.param_groups
    assert group["lr"] == pytest.approx(expected)
    assert strategy.config.lr == 0.03  # the option keeps its given value


# ---------------------------------------------------------------------- defaults and bad input


def test_the_defaults_are_avalanches_port():
    config = L2P(tiny_vit()).config
    assert (config.grad_clip_norm, config.batchwise_selection, config.lr_batch_scaling) == (None, "never", False)


@pytest.mark.parametrize("option, value, message", [
    ("grad_clip_norm", 0, "grad_clip_norm must be a number > 0, got 0"),
    ("grad_clip_norm", -1.0, "grad_clip_norm must be a number > 0, got -1.0"),
    ("grad_clip_norm", "1", "grad_clip_norm must be a number > 0, got '1'"),
    ("batchwise_selection", True, r"batchwise_selection must be one of \('never', 'training', 'always'\), got True"),
    ("batchwise_selection", "batch", "batchwise_selection must be one of .*got 'batch'"),
    ("lr_batch_scaling", "yes", "lr_batch_scaling must be True or False, got 'yes'"),
])
def test_l2p_refuses_bad_fidelity_options(option, value, message):
    with pytest.raises(ValueError, match=message):
        L2P(tiny_vit(), **{option: value})


def test_the_pool_selects_per_sample_unless_asked_for_the_batch():
    pool = PromptPool(pool_size=8, prompt_length=2, width=16)
    queries = torch.randn(6, 16, generator=torch.Generator().manual_seed(1))
    per_sample = pool.select(queries, 3)
    assert torch.equal(pool.select(queries, 3, batchwise=False), per_sample)
    assert torch.equal(pool.select(queries, 3, batchwise=True), majority_selection(per_sample, 8))
