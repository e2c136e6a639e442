"""Backbones in any floating dtype: images are converted to it; the trained weights (experts, heads) are float32
beside a bfloat16 or float16 backbone and in its dtype beside a float64 one (avalanche_color.lora.trained_dtype)."""

import pytest
import torch

from avalanche_color import L2P, CoLoR, SPrompts, fit_prototypes
from avalanche_color.experts.routed_vit import backbone_images
from avalanche_color.lora import trained_dtype
from helpers import quiet_evaluator
from streams import domain_stream, tiny_vit

METHODS = {
    "color": (CoLoR, dict(rank=4)),
    "color-gaussian": (CoLoR, dict(rank=4, router="gaussian")),
    "color-ridge": (CoLoR, dict(rank=4, router="ridge", router_width=64)),
    "s-prompts": (SPrompts, dict(prompt_length=2)),
}


def trained(method: str, dtype: torch.dtype, benchmark):
    strategy_class, options = METHODS[method]
    strategy = strategy_class(tiny_vit(0).to(dtype), k=3, lr=0.05, train_epochs=2, train_mb_size=16,
                              eval_mb_size=64, evaluator=quiet_evaluator(), **options)
    for experience in benchmark.train_stream:
        strategy.train(experience)
    strategy.eval(benchmark.test_stream)
    return strategy.model.eval()


def labelled_test_images(benchmark) -> tuple[torch.Tensor, torch.Tensor]:
    """The test images (float32) and the expert each belongs to."""
    images = [torch.stack([sample[0] for sample in experience.dataset]) for experience in benchmark.test_stream]
    experts = torch.cat([torch.full((len(batch),), index) for index, batch in enumerate(images)])
    return torch.cat(images), experts


@pytest.fixture(scope="module")
def benchmark():
    return domain_stream(num_domains=2)


@pytest.fixture(scope="module")
def float32_routes(benchmark) -> dict[str, torch.Tensor]:
    images, _ = labelled_test_images(benchmark)
    models = {method: trained(method, torch.float32, benchmark) for method in METHODS}
    with torch.no_grad():
        return {method: model.route(images) for method, model in models.items()}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("method", list(METHODS))
def test_backbone_dtype_trains_evaluates_and_routes_as_float32(method, dtype, benchmark, float32_routes, one_thread):
    model = trained(method, dtype, benchmark)
    kept = trained_dtype(dtype)  # float32 for bfloat16 and float16, float64 for float64
    assert {p.dtype for head in model.bank.heads for p in head.parameters()} == {kept}
    own = {p.dtype for expert in range(model.num_experts) for module in model.bank.expert_modules(expert)
           for p in module.parameters()}
    # CoLoR's LoRA factors follow the heads; S-Prompts makes its prompt tokens float32 whatever the backbone.
    assert own == ({torch.float32} if method == "s-prompts" else {kept})
    backbone = [v for k, v in model.state_dict().items() if k in model.backbone_keys and v.is_floating_point()]
    assert {v.dtype for v in backbone} == {dtype}  # the frozen backbone stays as given
    images, experts = labelled_test_images(benchmark)  # float32 images, converted by the model
    with torch.no_grad():
        logits, routes = model(images), model.route(images)
    assert logits.dtype == kept
    # Each sample's routed expert scores its own classes with finite logits (-inf elsewhere).
    known = torch.stack([torch.isin(torch.arange(model.num_classes), model.bank.heads[e].classes) for e in routes.tolist()])
    assert bool(logits[known].isfinite().all()) and bool((logits[~known] == float("-inf")).all())
    # The toy domains are far apart: float32 routes every sample to its own expert, and so does this dtype.
    assert torch.equal(float32_routes[method], experts)
    assert torch.equal(routes, float32_routes[method])


@pytest.mark.parametrize("image_dtype, backbone_dtype", [(torch.float64, torch.float32),
                                                         (torch.float32, torch.bfloat16),
                                                         (torch.float16, torch.float64)])
def test_images_of_another_floating_dtype_give_the_logits_of_converted_images(image_dtype, backbone_dtype, benchmark,
                                                                              one_thread):
    model = trained("color", backbone_dtype, benchmark)
    images, _ = labelled_test_images(benchmark)
    images = images.to(image_dtype)
    with torch.no_grad():
        assert torch.equal(model(images), model(images.to(backbone_dtype)))


def test_integer_images_stay_refused():
    vit = tiny_vit(0).to(torch.bfloat16)
    with pytest.raises(ValueError, match="floating-point.*got dtype torch.uint8"):
        backbone_images(vit, torch.zeros(2, 3, 16, 16, dtype=torch.uint8))
    assert backbone_images(vit, torch.zeros(2, 3, 16, 16)).dtype == torch.bfloat16


def test_prototypes_of_bfloat16_features_are_float32_kmeans_of_them():
    features = torch.randn(40, 8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    centres = fit_prototypes(features, 4)
    assert centres.dtype == torch.float32
    torch.testing.assert_close(centres, fit_prototypes(features.float(), 4))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_l2p_pool_and_head_are_float32_or_wider_beside_the_backbone(dtype, benchmark, one_thread):
    strategy = L2P(tiny_vit(0).to(dtype), pool_size=4, prompt_length=2, top_n=2, train_epochs=1, train_mb_size=16,
                   eval_mb_size=64, evaluator=quiet_evaluator())
    for experience in benchmark.train_stream:
        strategy.train(experience)
    model = strategy.model.eval()
    kept = trained_dtype(dtype)  # float32 beside bfloat16, float64 beside float64
    assert {p.dtype for p in model.trainable_parameters()} == {kept}
    assert {p.dtype for p in model.backbone.parameters()} == {dtype}
    images, _ = labelled_test_images(benchmark)  # float32 images, converted by the model
    with torch.no_grad():
        logits = model(images)
    trained_classes = model.trained_classes
    assert logits.dtype == kept
    assert bool(logits[:, trained_classes].isfinite().all()) and bool((logits[:, ~trained_classes] == float("-inf")).all())
