"""The LoRA experts: exact start, q/v only, loralib's math, mixed batches, parameter count, the
experts passed explicitly through timm's blocks."""

import pytest
import timm
import torch

from avalanche_color import ExpertViT, QKVExperts
from streams import IMAGE_SIZE, tiny_vit


def randomise_experts(model: ExpertViT, seed: int = 1) -> None:
    """Give every expert non-zero B (a new expert has B = 0) and random heads."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".experts." in name or name.startswith("bank.heads."):
                parameter.copy_(torch.randn(parameter.shape, generator=generator))


def images(n: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(seed))


def test_new_expert_computes_exactly_the_backbone():
    reference = tiny_vit().eval()
    model = ExpertViT(tiny_vit(), rank=4)
    model.start_expert([0, 1])
    x = images()
    expected = reference.forward_head(reference.forward_features(x), pre_logits=True)
    assert torch.equal(model.features(x, 0), expected)
    assert torch.equal(model.features(x, None), expected)


def test_key_projection_is_never_adapted():
    model = ExpertViT(tiny_vit(), rank=4)
    model.start_expert([0, 1])
    randomise_experts(model)
    layer = model.qkv_layers[0]
    tokens = torch.randn(2, 5, layer.in_features)
    base = layer(tokens)
    adapted = layer(tokens, 0)
    d = layer.head_width
    assert torch.equal(adapted[..., d : 2 * d], base[..., d : 2 * d])
    assert not torch.allclose(adapted[..., :d], base[..., :d])
    assert not torch.allclose(adapted[..., 2 * d :], base[..., 2 * d :])
    assert all(name in {"A", "B"} for name, _ in layer.experts[0].named_parameters())


def test_matches_loralib_merged_linear_on_q_and_v():
    loralib = pytest.importorskip("loralib")  # the tests' reference (extra `test`), not a runtime dependency
    torch.manual_seed(0)
    d, r, alpha = 12, 3, 6
    reference = loralib.MergedLinear(d, 3 * d, r=r, lora_alpha=alpha, enable_lora=[True, False, True],
                                     merge_weights=False)
    torch.nn.init.normal_(reference.lora_B)
    base = torch.nn.Linear(d, 3 * d)
    base.load_state_dict({"weight": reference.weight, "bias": reference.bias})
    layer = QKVExperts(base)
    expert = layer.new_expert(r, alpha)
    layer.experts.append(expert)  # as the expert bank adds it: expert 0
    with torch.no_grad():
        expert.A.copy_(reference.lora_A.view(2, r, d))
        expert.B.copy_(reference.lora_B.view(2, d, r))
    x = torch.randn(4, 7, d)
    torch.testing.assert_close(layer(x, 0), reference(x))


def three_random_experts() -> ExpertViT:
    """Three experts with random weights; the newest (2) trains, as after start_expert."""
    model = ExpertViT(tiny_vit(), rank=4).eval()
    for classes in ([0, 1], [2, 3, 4], [5]):
        model.start_expert(classes)
    randomise_experts(model)
    return model


def set_training(model: ExpertViT, expert: int, trains: bool) -> None:
    model.bank.set_trainable(expert if trains else None)


@pytest.mark.parametrize("newest_trains", [False, True],
                         ids=["frozen (merged, updates added in place)", "one trains (low-rank)"])
def test_mixed_batch_rows_equal_each_experts_own_run(newest_trains):
    model = three_random_experts()
    set_training(model, 2, newest_trains)
    x = images(6)
    experts = torch.tensor([2, 0, 1, 1, 0, 2])
    with torch.no_grad():
        mixed = model.predict(x, experts)
        for row, expert in enumerate(experts.tolist()):
            alone = model.predict(x[row : row + 1], expert)
            torch.testing.assert_close(mixed[row : row + 1], alone, rtol=1e-5, atol=1e-5)
    # each row has finite logits exactly on its expert's classes
    known = torch.isfinite(mixed)
    for row, expert in enumerate(experts.tolist()):
        assert known[row].nonzero().squeeze(1).tolist() == model.bank.heads[expert].classes.tolist()


def test_trainable_parameters_match_the_papers_table_1():
    vit = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=0)
    model = ExpertViT(vit, rank=1)
    model.start_expert([0, 1])
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable == 12 * 2 * 1 * (768 + 768) + 768 * 2 + 2 == 38_402


def test_all_experts_share_one_copy_of_the_backbone_weights():
    model = ExpertViT(tiny_vit(), rank=2)
    for _ in range(3):
        model.start_expert([0, 1])
    backbone_params = sum(p.numel() for n, p in model.named_parameters() if ".experts." not in n
                          and not n.startswith("bank.heads."))
    assert backbone_params == sum(p.numel() for p in tiny_vit().parameters())


@pytest.mark.parametrize("rank", [1, 8])
def test_new_expert_trains_only_its_own_weights(rank):
    model = ExpertViT(tiny_vit(), rank=rank)
    model.start_expert([0, 1])
    model.start_expert([2, 3])
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".experts.1." in n or n.startswith("bank.heads.1.") for n in trainable)


@pytest.mark.parametrize(
    "shape",
    [
        dict(img_size=32, patch_size=8, embed_dim=48, depth=3, num_heads=3),
        dict(img_size=24, patch_size=6, embed_dim=24, depth=1, num_heads=2, global_pool="avg"),
        dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, reg_tokens=2, qk_norm=True),
    ],
    ids=["wider-deeper", "avg-pool", "registers"],
)
def test_any_timm_vit_shape_works(shape):
    vit = tiny_vit(**shape)
    reference = tiny_vit(**shape).eval()
    model = ExpertViT(vit, rank=2)
    model.start_expert([3, 7])
    randomise_experts(model)
    size = shape["img_size"]
    x = torch.randn(3, 3, size, size)
    assert model.features(x, 0).shape == (3, shape["embed_dim"])
    expected = reference.forward_head(reference.forward_features(x), pre_logits=True)
    assert torch.equal(model.features(x), expected)
    logits = model.eval().predict(x, 0)
    assert logits.shape == (3, 8) and torch.isfinite(logits[:, [3, 7]]).all()


def test_merged_weights_equal_the_low_rank_update():
    model = three_random_experts()
    x = images(5)
    for expert in range(3):
        set_training(model, expert, False)
        merged = model.predict(x, expert)  # a frozen expert: merged into the weight
        set_training(model, expert, True)
        unmerged = model.predict(x, expert)  # an expert that trains: base output + low-rank update
        assert unmerged.requires_grad and not merged.requires_grad  # the grad mode is on for both
        torch.testing.assert_close(merged, unmerged.detach(), rtol=1e-5, atol=1e-5)
    layer = model.qkv_layers[1]
    delta = layer.merged_weight(2) - layer.base_layer.weight
    expert = layer.experts[2]
    d = layer.head_width
    torch.testing.assert_close(delta[:d], expert.scaling * expert.B[0] @ expert.A[0])
    assert torch.equal(delta[d : 2 * d], torch.zeros_like(delta[d : 2 * d]))


def test_merging_never_writes_the_shared_weight():
    model = three_random_experts()
    before = [layer.base_layer.weight.clone() for layer in model.qkv_layers]
    with torch.no_grad():
        model.predict(images(6), torch.tensor([0, 1, 2, 0, 1, 2]))
    assert all(torch.equal(b, layer.base_layer.weight) for b, layer in zip(before, model.qkv_layers))


def test_routed_inference_and_training_run_under_bf16_autocast():
    model = ExpertViT(tiny_vit(), rank=4)
    model.start_expert([0, 1])
    model.start_expert([2, 3])
    model.router.set_prototypes(0, torch.zeros(1, 32))
    model.router.set_prototypes(1, torch.ones(1, 32))
    images = torch.randn(6, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    model.eval()
    with torch.no_grad():
        plain = model(images)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = model(images)
    assert mixed.dtype == plain.dtype and torch.equal(torch.isinf(mixed), torch.isinf(plain))
    torch.testing.assert_close(mixed[~torch.isinf(mixed)], plain[~torch.isinf(plain)], atol=0.1, rtol=0.1)
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(images)[:, 2:].logsumexp(1).mean()
    loss.backward()
    assert model.qkv_layers[0].experts[1].A.grad is not None


@pytest.mark.parametrize("fused_attention", [True, False])
@pytest.mark.parametrize("shape", [dict(), dict(reg_tokens=2, qk_norm=True, global_pool="avg")], ids=["plain", "registers"])
def test_the_explicit_forward_is_timms_bit_for_bit_without_experts(shape, fused_attention):
    reference = tiny_vit(**shape).eval()
    model = ExpertViT(tiny_vit(**shape), rank=2)
    model.start_expert([0, 1])
    randomise_experts(model)
    for block in [*reference.blocks, *model.backbone.blocks]:
        block.attn.fused_attn = fused_attention
    x = images(3)
    assert torch.equal(model.features(x, None), reference.forward_head(reference.forward_features(x), pre_logits=True))
    # timm's own forward on the adapted ViT calls each qkv layer without experts: the backbone.
    assert torch.equal(model.backbone.forward_features(x), reference.forward_features(x))


def test_one_frozen_expert_equals_a_vit_with_its_update_merged_into_the_weights():
    model = three_random_experts()
    set_training(model, 2, False)
    merged = tiny_vit().eval()
    with torch.no_grad():
        for block, layer in zip(merged.blocks, model.qkv_layers):
            block.attn.qkv.weight.copy_(layer.merged_weight(1))
    x = images(4)
    expected = merged.forward_head(merged.forward_features(x), pre_logits=True)
    assert torch.equal(model.features(x, 1), expected)


def test_a_forward_leaves_no_selection_behind():
    model = three_random_experts()
    layers_before = [dict(vars(layer)) for layer in model.qkv_layers]
    x = images(4)
    backbone = model.features(x)
    model.features(x, [(0, slice(0, 2)), (1, slice(2, 4))])
    model.features(x, 2)
    assert torch.equal(model.features(x), backbone)
    assert [dict(vars(layer)) for layer in model.qkv_layers] == layers_before


def test_other_block_types_are_refused_naming_the_block():
    from timm.models.vision_transformer import ResPostBlock

    with pytest.raises(TypeError, match=r"model.blocks\[0\] must be a timm Block .* got ResPostBlock"):
        ExpertViT(tiny_vit(block_fn=ResPostBlock))


def test_in_a_mixed_batch_gradients_reach_only_the_expert_that_trains():
    model = three_random_experts()  # expert 2 trains
    x = images(6)
    experts = torch.tensor([2, 0, 1, 1, 0, 2])
    model.train()(x, experts=experts)[:, 5].sum().backward()  # class 5: expert 2's only class
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    assert grads and all(".experts.2." in name or name.startswith("bank.heads.2.") for name in grads)
    alone = three_random_experts()
    alone.train()(x[[0, 5]], experts=2)[:, 5].sum().backward()
    for name, parameter in alone.named_parameters():
        if parameter.grad is not None:
            torch.testing.assert_close(grads[name], parameter.grad, rtol=1e-5, atol=1e-6)
