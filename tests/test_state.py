"""Saving and loading: experts, heads and prototypes round-trip without the backbone."""

import torch

from avalanche_color import ExpertViT
from helpers import tiny_color
from streams import class_stream, tiny_vit


def test_state_dict_round_trip_gives_identical_logits():
    benchmark = class_stream(num_experiences=3)
    strategy = tiny_color(train_epochs=2)
    for experience in benchmark.train_stream:
        strategy.train(experience)
    trained = strategy.model.eval()
    state = trained.experts_state_dict()
    assert not any(k.startswith("backbone.") and ".experts." not in k for k in state)

    restored = ExpertViT(tiny_vit(), rank=4)  # the same pretrained backbone, no experts yet
    restored.load_experts_state_dict(state)
    restored.eval()
    images = torch.cat([torch.stack([s[0] for s in e.dataset]) for e in benchmark.test_stream])
    assert restored.num_experts == 3
    assert torch.equal(restored(images), trained(images))
    assert torch.equal(restored.router.prototypes, trained.router.prototypes)
    assert torch.equal(restored.bank.experiences, trained.bank.experiences)


def test_full_state_dict_also_round_trips():
    strategy = tiny_color(train_epochs=1)
    strategy.train(class_stream().train_stream[0])
    restored = ExpertViT(tiny_vit(seed=5), rank=4)
    restored.load_state_dict(strategy.model.state_dict())
    for (name, a), (_, b) in zip(restored.state_dict().items(), strategy.model.state_dict().items()):
        assert torch.equal(a, b), name
