"""Training CoLoR: only the current expert learns, old experts stay bit-identical, it beats Naive."""

import pytest
import torch
from avalanche.core import SupervisedPlugin

from helpers import naive_accuracy, stream_metric, tiny_color, train_all
from streams import class_stream, domain_stream


class GradientRecorder(SupervisedPlugin):
    """Records, after every backward, which parameters received a gradient."""

    def __init__(self):
        super().__init__()
        self.with_gradient: list[set[str]] = []

    def after_backward(self, strategy, **kwargs):
        self.with_gradient.append(
            {name for name, p in strategy.model.named_parameters() if p.grad is not None and p.grad.any()}
        )


def expert_zero_state(model):
    keep = {k: v.clone() for k, v in model.experts_state_dict().items()
            if ".experts.0." in k or k.startswith("bank.heads.0.")}
    keep["prototypes"] = model.router.prototypes[model.router.owners == 0].clone()
    return keep


def test_only_the_current_expert_learns_and_earlier_experts_stay_identical():
    recorder = GradientRecorder()
    strategy = tiny_color(train_epochs=2, plugins=[recorder])
    benchmark = domain_stream()
    strategy.train(benchmark.train_stream[0])
    before = expert_zero_state(strategy.model)
    recorder.with_gradient.clear()
    strategy.train(benchmark.train_stream[1])

    assert recorder.with_gradient, "no training step was recorded"
    for names in recorder.with_gradient:
        assert names and all(".experts.1." in n or n.startswith("bank.heads.1.") for n in names), names
    after = expert_zero_state(strategy.model)
    assert before.keys() == after.keys()
    for key in before:
        assert torch.equal(before[key], after[key]), key


def test_optimiser_holds_only_the_current_expert():
    strategy = tiny_color(train_epochs=1)
    benchmark = class_stream()
    for experience in benchmark.train_stream:
        strategy.train(experience)
        optimised = {id(p) for group in strategy.optimizer.param_groups for p in group["params"]}
        current = {id(p) for p in strategy.model.expert_parameters(strategy.model.num_experts - 1)}
        assert optimised == current


def test_backbone_stays_in_eval_mode_while_training():
    strategy = tiny_color(train_epochs=1)
    strategy.train(class_stream().train_stream[0])
    strategy.model.train()
    assert strategy.model.training
    assert not any(m.training for m in strategy.model.backbone.modules())


@pytest.mark.parametrize(
    "make_stream, num_classes",
    [(domain_stream, 3), (class_stream, 4)],
    ids=["domain-incremental", "class-incremental"],
)
def test_color_beats_naive_fine_tuning(make_stream, num_classes):
    benchmark = make_stream()
    color = stream_metric(train_all(tiny_color(), benchmark), "Top1_Acc")
    naive = naive_accuracy(make_stream(), num_classes)
    assert color > naive + 0.2, (color, naive)
