"""Expert warm start (``warm_start=True``): a new expert starts as the previous one (its LoRA weights, and its head
where the classes are the same); finished experts never change; the paper's zero B stays the default."""

import pytest
import torch
from avalanche.core import SupervisedPlugin

from avalanche_color import CoLoR, ExpertViT
from helpers import UNSATURATED, quiet_evaluator, tiny_color, train_all
from streams import domain_stream, tiny_vit


def with_trained_first_expert(classes=(0, 1, 2), **options) -> ExpertViT:
    """A float64 ExpertViT whose first expert has random (non-zero) LoRA weights and head, finished."""
    model = ExpertViT(tiny_vit().double(), rank=2, **options)
    model.start_expert(list(classes), experience=0)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in model.expert_parameters(0):
            parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator, dtype=torch.float64))
    model.finish_expert(0)
    return model


def images(count: int = 6) -> torch.Tensor:
    return torch.randn(count, 3, 16, 16, generator=torch.Generator().manual_seed(4), dtype=torch.float64)


def test_a_warm_started_expert_first_computes_what_the_previous_one_does_head_included_where_classes_are_shared():
    model = with_trained_first_expert(warm_start=True)
    model.start_expert([0, 1, 2], experience=1)
    for new, old in zip(model.expert_parameters(1), model.expert_parameters(0), strict=True):
        assert torch.equal(new, old) and new.data_ptr() != old.data_ptr()  # copies, not shared
    x = images()
    torch.testing.assert_close(model.predict(x, 1), model.predict(x, 0), rtol=0, atol=1e-12)
    assert model.bank.trainable == 1 and all(not p.requires_grad for p in model.expert_parameters(0))


def test_other_classes_get_the_lora_weights_and_a_fresh_head():
    model = with_trained_first_expert(warm_start=True)
    torch.manual_seed(5)
    model.start_expert([3, 4], experience=1)
    x = images()
    torch.testing.assert_close(model.features(x, 1), model.features(x, 0), rtol=0, atol=1e-12)
    torch.manual_seed(5)
    model.new_expert_modules()  # the draws start_expert makes before its head's
    reference = torch.nn.Linear(model.num_features, 2).double()
    assert torch.equal(model.bank.heads[1].linear.weight, reference.weight)  # the head a cold start draws


def test_without_warm_start_a_new_expert_is_the_backbone_exactly():
    model = with_trained_first_expert()
    model.start_expert([0, 1, 2], experience=1)
    assert all(float(layer.experts[1].B.detach().abs().max()) == 0 for layer in model.qkv_layers)
    x = images()
    assert torch.equal(model.features(x, 1, trained=1), model.features(x))
    assert not torch.equal(model.bank.heads[1].linear.weight, model.bank.heads[0].linear.weight)


class FirstForwards(SupervisedPlugin):
    """At the first training step of each experience after the first: the batch's logits of the new expert and
    of the expert before it, and a copy of every earlier expert's parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.logits: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.earlier: list[list[torch.Tensor]] = []

    def before_training_iteration(self, strategy, **kwargs):
        model, new = strategy.model, strategy.model.bank.trainable
        if new and strategy.clock.train_exp_iterations == 0:
            with torch.no_grad():
                self.logits.append((model.predict(strategy.mb_x, new), model.predict(strategy.mb_x, new - 1)))
            self.earlier.append([p.detach().clone() for e in range(new) for p in model.expert_parameters(e)])


# The paper's router, and the Gaussian one the runner's CoLoR-gaussian-warm composes it with.
@pytest.mark.parametrize("router", ["prototypes", "gaussian"])
def test_in_a_domain_incremental_run_each_expert_starts_as_the_last_and_finished_ones_stay_as_they_were(
        tmp_path, router):
    benchmark = domain_stream(num_domains=3)
    seen = FirstForwards()
    strategy = tiny_color(warm_start=True, router=router, plugins=[seen], **UNSATURATED)
    train_all(strategy, benchmark)
    model = strategy.model
    assert len(seen.logits) == 2
    for new, previous in seen.logits:
        torch.testing.assert_close(new, previous, rtol=0, atol=1e-5)
    for index, before in enumerate(seen.earlier):  # before experience index + 1 trained, and after the run
        after = [p for e in range(index + 1) for p in model.expert_parameters(e)]
        assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))
    assert not torch.equal(model.qkv_layers[0].experts[2].B, model.qkv_layers[0].experts[1].B)  # it trained
    # Saved and loaded with the model: the option, and predictions bit-identical.
    folder = model.eval().save_pretrained(tmp_path / "warm")
    loaded = ExpertViT.from_pretrained(folder, tiny_vit())
    x = torch.cat([torch.stack([s[0] for s in e.dataset]) for e in benchmark.test_stream])
    assert loaded.config.warm_start is True and loaded.config.router == router
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    loaded_state, state = loaded.experts_state_dict(), model.experts_state_dict()
    assert loaded_state.keys() == state.keys() and all(torch.equal(loaded_state[k], state[k]) for k in state)


def test_a_loaded_model_keeps_its_experts_not_warm_copies():
    model = with_trained_first_expert(warm_start=True)
    model.start_expert([0, 1, 2], experience=1)
    with torch.no_grad():
        for parameter in model.expert_parameters(1):
            parameter.add_(1.0)
    copy = ExpertViT(tiny_vit().double(), rank=2, warm_start=True)
    copy.load_experts_state_dict(model.experts_state_dict())
    for loaded, saved in zip(copy.expert_parameters(1), model.expert_parameters(1), strict=True):
        assert torch.equal(loaded, saved)


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_bad_value_is_refused_by_name(value):
    with pytest.raises(ValueError, match=f"warm_start must be True or False, got {value!r}"):
        CoLoR(tiny_vit(), evaluator=quiet_evaluator(), warm_start=value)
