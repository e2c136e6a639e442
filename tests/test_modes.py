"""A finished model predicts the same in train and eval mode, or refuses: never silently differently."""

import pytest
import torch

from avalanche_color import ExpertViT, PromptExpertViT
from helpers import UNSATURATED, tiny_color, train_all
from streams import class_stream, tiny_vit


def test_a_loaded_model_left_in_train_mode_refuses_and_after_eval_predicts_as_trained():
    benchmark = class_stream(num_experiences=3)
    strategy = tiny_color(**UNSATURATED)
    train_all(strategy, benchmark)  # Avalanche put the model in train mode for each experience: it trained
    trained = strategy.model.eval()
    images = torch.cat([torch.stack([s[0] for s in e.dataset]) for e in benchmark.test_stream])
    expected = trained(images)

    loaded = ExpertViT(tiny_vit(), rank=4)  # a new module starts in train mode: the README's pitfall
    loaded.load_experts_state_dict(trained.experts_state_dict())
    assert loaded.training and bool(loaded.bank.finished.all())
    with pytest.raises(RuntimeError, match=r"train mode.*none of its 3 experts trains: call model.eval\(\)"):
        loaded(images)
    assert torch.equal(loaded.eval()(images), expected)
    with pytest.raises(RuntimeError, match="call model.eval"):
        trained.train()(images)


@pytest.mark.parametrize("model_class", [ExpertViT, PromptExpertViT])
def test_while_an_expert_trains_train_mode_predicts_with_it(model_class):
    model = model_class(tiny_vit())
    model.start_expert([0, 1])
    model.finish_expert(0)
    model.start_expert([2, 3])  # unfinished: the one being trained
    images = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    model.train()
    assert torch.equal(model(images), model.predict(images, 1))
    assert model(images)[:, :2].isinf().all() and model(images)[:, 2:].isfinite().all()


def test_training_continues_after_a_finished_experience():
    # Avalanche calls model.train() before each experience; adaptation adds an unfinished expert first.
    benchmark = class_stream(num_experiences=2)
    strategy = tiny_color(**UNSATURATED)
    strategy.train(benchmark.train_stream[0])
    assert bool(strategy.model.bank.finished.all())
    strategy.train(benchmark.train_stream[1])
    assert strategy.model.num_experts == 2 and bool(strategy.model.bank.finished.all())
