"""RouterFitting, the algorithm behind PrototypeRouterPlugin, used without a strategy: the fit equals the
plugin's in a strategy run, an online stream's chunks accumulate, and "fitted for good" flips as documented."""

import copy

import pytest
import torch

from avalanche_color import ExpertViT
from avalanche_color.config import PrototypeOptions
from avalanche_color.routing.routers import make_router
from avalanche_color.training.router_fitting import RouterFitting
from avalanche_color.utils.experiences import experience_classes
from drop_in_cases import online
from helpers import UNSATURATED, tiny_color, train_all
from streams import class_stream, tiny_vit


def backbone_passes(model: torch.nn.Module) -> list[int]:
    """The batch size of every eval-mode pass through ``model``'s patch embedding, as they come."""
    passes: list[int] = []

    def record(module, args, out):
        if not model.training:
            passes.append(args[0].shape[0])

    model.backbone.patch_embed.register_forward_hook(record)
    return passes


def started(seed: int = 0, **options) -> tuple[ExpertViT, torch.utils.data.Dataset]:
    """A tiny ExpertViT with an expert for the first experience of ``class_stream``, and that experience's data."""
    experience = class_stream(seed=seed).train_stream[0]
    model = ExpertViT(tiny_vit(seed), rank=2, **options)
    model.start_expert(experience_classes(experience), experience=0)
    return model, experience.dataset


ROUTER_OPTIONS = {"prototypes": dict(), "first_expert": dict(routing_features="first_expert"),
                  "ridge": dict(router="ridge", router_width=64), "per_class": dict(prototypes_per_class=2)}


@pytest.mark.parametrize("options", list(ROUTER_OPTIONS.values()), ids=list(ROUTER_OPTIONS))
def test_fitting_from_the_datasets_equals_the_plugins_fit_in_a_strategy_run(options):
    benchmark = class_stream(num_experiences=2, per_class=10)
    strategy = tiny_color(**UNSATURATED, **options)
    train_all(strategy, benchmark)
    model = copy.deepcopy(strategy.model)
    model.router = make_router(model.config, model.num_features)  # nothing fitted
    fitting = RouterFitting(strategy.config.group(PrototypeOptions))
    for expert, experience in enumerate(benchmark.train_stream):
        # The plugin fits an expert while it still trains, then finishes it: the first expert's features
        # take its training path, which may differ from its frozen one in the last bit.
        model.bank.set_trainable(expert)
        fitting.add_data(experience.dataset)
        fitting.fit(model, expert, batch_size=strategy.eval_mb_size)
        fitting.finish(model, expert)
    expected = strategy.model.router.state_dict()
    assert expected.keys() == model.router.state_dict().keys()
    for name, value in model.router.state_dict().items():
        assert torch.equal(value, expected[name]), name


def test_an_online_streams_chunks_accumulate_until_its_experience_ends(tmp_path):
    chunks, _ = online(tmp_path, access_task_boundaries=True)  # chunks of 10, 4 per experience
    fitting, model = RouterFitting(k=12), ExpertViT(tiny_vit(), rank=2)
    for index, chunk in enumerate(chunks):
        fitting.start_experience(chunk)
        origin = chunk.origin_experience
        assert fitting.experience.current_experience == origin.current_experience == index // 4
        if index % 4 == 0:
            assert fitting.current_expert(model) is None  # its expert comes with the model's adaptation
            model.start_expert(experience_classes(origin), experience=origin.current_experience)
        expert = fitting.current_expert(model)
        assert expert == index // 4 and fitting.seen_samples == (index % 4 + 1) * 10 == len(fitting.chunks) * 10
        assert not fitting.fitted_for_good(model, expert), "a chunk came since the last fit"
        fitting.fit(model, expert, batch_size=16)
        assert model.router.owners.tolist().count(expert) == min(12, fitting.seen_samples)
        assert fitting.fitted_for_good(model, expert) and fitting.fitted_chunks == len(fitting.chunks)
        assert fitting.ends_experience(chunk) == (index % 4 == 3)
        if fitting.ends_experience(chunk):
            fitting.finish(model, expert)
            assert bool(model.bank.finished[expert]) and fitting.current_expert(model) is None
    assert model.router.owners.tolist() == [0] * 12 + [1] * 12


def test_with_first_expert_features_a_fit_is_for_good_once_the_first_expert_is_finished():
    model, data = started(routing_features="first_expert")
    fitting = RouterFitting(k=3)
    fitting.add_data(data)
    fitting.fit(model, 0, batch_size=16)
    assert model.router.knows(0) and not fitting.fitted_for_good(model, 0), "the first expert still trains"
    model.finish_expert(0)
    assert fitting.fitted_for_good(model, 0)
    fitting.add_data(data, continues=True)
    assert len(fitting.chunks) == 2 and not fitting.fitted_for_good(model, 0)
    fitting.add_data(data)  # a new experience's data
    assert len(fitting.chunks) == 1 and fitting.fitted_chunks == 0


@pytest.mark.parametrize("router", ["oracle", "prototypes"])
def test_the_oracle_router_needs_no_pass(router):
    model, data = started(router=router)
    fitting = RouterFitting(k=3)
    fitting.add_data(data)
    assert fitting.fitted_for_good(model, 0) == (router == "oracle")
    fitting.add_data(data, continues=True)  # more data changes nothing for the oracle
    assert fitting.fitted_for_good(model, 0) == (router == "oracle")
    # Through the plugin in a strategy run: no pass in eval mode (the fit's) for the oracle.
    strategy = tiny_color(router=router, **UNSATURATED)
    passes = backbone_passes(strategy.model)
    experience = class_stream().train_stream[0]
    strategy.train(experience)
    assert bool(strategy.model.bank.finished[0])
    assert passes == ([] if router == "oracle" else [len(experience.dataset)])


def test_a_fit_is_seeded_and_leaves_the_runs_generators_and_the_models_mode_as_they_were():
    model, data = started()
    noisy = data.train().replace_current_transform_group(lambda x: x + torch.randn_like(x))
    assert not torch.equal(noisy[0][0], noisy[0][0]), "the training transform draws noise"
    fitting = RouterFitting(k=3, prototype_data="train")
    fitting.add_data(noisy)
    model.train()
    fitted = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        state = torch.get_rng_state()
        fitting.fit(model, 0, batch_size=16)
        assert torch.equal(torch.get_rng_state(), state) and model.training
        fitted.append(model.router.prototypes.clone())
    assert torch.equal(*fitted)


def test_a_fit_without_data_or_batch_size_is_refused():
    model, data = started()
    with pytest.raises(ValueError, match="no training data to fit expert 0's router from"):
        RouterFitting(k=3).fit(model, 0, batch_size=16)
    fitting = RouterFitting(k=3)
    fitting.add_data(data)
    with pytest.raises(ValueError, match="needs a batch_size"):
        fitting.fit(model, 0)
    fitting = RouterFitting(k=3, prototype_batch_size=16)  # the config's batch size is the default
    fitting.add_data(data)
    fitting.fit(model, 0)
    assert model.router.owners.tolist() == [0, 0, 0]
