"""Transformer-NFN: the fast layers equal the term-by-term reference, are equivariant / invariant under random
group elements (float64, hypothesis), keep activations in range, and reject mismatched inputs clearly."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nfn_baselines.models.layers import EquivariantLayer, InvariantLayer
from nfn_baselines.models.model import TransformerNFN, TransformerNFNEncoder, count_parameters
from nfn_baselines.models.reference import reference_equivariant, reference_invariant
from nfn_baselines.models.weight_stack import BlockStack
from small_transformer_zoo.format.architecture import ArchitectureSpec, mnist_spec, text_spec
from small_transformer_zoo.weights.symmetry import GroupElement, sample_group_element
from small_transformer_zoo.weights.weight_space import TransformerWeights

ZOO = mnist_spec()
SPECS = st.one_of(
    st.just(ZOO),
    st.builds(ArchitectureSpec, modality=st.just("vision"), num_classes=st.just(3), d_model=st.sampled_from([4, 6]),
              num_heads=st.sampled_from([1, 2, 4]), d_head=st.integers(1, 4), d_mlp=st.sampled_from([3, 5, 9]),
              num_blocks=st.sampled_from([1, 2, 3]), image_size=st.just(8), patch_size=st.just(4)),
)


def random_stack(spec: ArchitectureSpec, batch: int, channels: int, seed: int) -> BlockStack:
    params = torch.randn(batch * channels, spec.n_params, dtype=torch.float64,
                         generator=torch.Generator().manual_seed(seed))
    stack = BlockStack.from_weights(TransformerWeights.from_params(params, spec))
    return BlockStack({k: v.reshape(batch, channels, *v.shape[1:]).transpose(1, 2).squeeze(3)
                       for k, v in stack.tensors.items()})


def act(g: GroupElement, stack: BlockStack) -> BlockStack:
    blocks = [g.blocks[b].act(block) for b, block in enumerate(stack.to_blocks())]
    return BlockStack({k: torch.stack([getattr(b, k) for b in blocks], dim=1) for k in stack.tensors})


def max_relative_error(a: BlockStack, b: BlockStack) -> float:
    return max(((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-300)).item() for k in a.tensors)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_fast_layers_compute_exactly_the_reference_terms(reduction: str) -> None:
    torch.manual_seed(0)
    spec = ArchitectureSpec("vision", 10, num_heads=3, d_head=5, d_mlp=7, num_blocks=2, d_model=6, image_size=8)
    for c_in in (1, 3):
        layer = EquivariantLayer(spec, c_in, 4, reduction).double()
        with torch.no_grad():
            for p in (layer.wa_bias, layer.ba_bias, layer.wb_bias, layer.bb_bias):
                p.normal_()
        x = random_stack(spec, 2, c_in, seed=c_in)
        assert max_relative_error(layer(x), reference_equivariant(layer, x)) < 1e-12
        inv = InvariantLayer(spec, c_in, 5, reduction, block_norm=reduction == "sum").double()
        assert torch.allclose(inv(x), reference_invariant(inv, x), rtol=1e-12, atol=1e-12)


def test_sums_start_as_the_same_function_as_means_and_train_differently_under_adam() -> None:
    """The paper's sums and the package's means: one function at initialisation, two trajectories under Adam
    (its step is per parameter, so the parametrisation matters)."""
    x = random_stack(ZOO, 4, 1, seed=5)
    target = torch.randn(4, 2 * 3, dtype=torch.float64)
    outputs = {}
    for reduction in ("mean", "sum"):
        torch.manual_seed(11)
        encoder = TransformerNFNEncoder(ZOO, channels=3, num_layers=1, reduction=reduction).double()
        start = encoder(x).detach()
        optimizer = torch.optim.Adam(encoder.parameters(), lr=1e-3)
        for _ in range(3):
            optimizer.zero_grad()
            ((encoder(x) - target) ** 2).mean().backward()
            optimizer.step()
        outputs[reduction] = (start, encoder(x).detach())
    assert torch.allclose(outputs["mean"][0], outputs["sum"][0], rtol=1e-9, atol=1e-12)
    moved = (outputs["mean"][1] - outputs["mean"][0]).abs().max()
    assert (outputs["mean"][1] - outputs["sum"][1]).abs().max() > 0.1 * moved


@settings(max_examples=20, deadline=None)
@given(spec=SPECS, c_in=st.integers(1, 3), c_out=st.integers(1, 3), seed=st.integers(0, 10**6),
       reduction=st.sampled_from(["mean", "sum"]))
def test_equivariant_layer(spec: ArchitectureSpec, c_in: int, c_out: int, seed: int, reduction: str) -> None:
    torch.manual_seed(seed)
    layer = EquivariantLayer(spec, c_in, c_out, reduction).double()
    x = random_stack(spec, 2, c_in, seed)
    g = sample_group_element(spec, torch.Generator().manual_seed(seed + 1), condition_number=5.0)
    assert max_relative_error(layer(act(g, x)), act(g, layer(x))) < 1e-9


@settings(max_examples=10, deadline=None)
@given(spec=SPECS, depth=st.integers(2, 3), seed=st.integers(0, 10**6))
def test_stack_of_layers_is_equivariant_and_encoder_invariant(spec: ArchitectureSpec, depth: int, seed: int) -> None:
    torch.manual_seed(seed)
    encoder = TransformerNFNEncoder(spec, channels=3, num_layers=depth).double()
    x = random_stack(spec, 2, 1, seed)
    g = sample_group_element(spec, torch.Generator().manual_seed(seed + 7), condition_number=5.0)
    assert max_relative_error(encoder.equivariant(act(g, x)), act(g, encoder.equivariant(x))) < 1e-9
    out, moved = encoder(x), encoder(act(g, x))
    assert ((moved - out).abs().max() / out.abs().max()).item() < 1e-9


@pytest.mark.parametrize("recipe", ["package", "paper"])
@pytest.mark.parametrize("spec", [ZOO, text_spec(vocab_size=20, max_length=5)], ids=["vision", "text"])
def test_full_model_is_invariant(spec: ArchitectureSpec, recipe: str) -> None:
    torch.manual_seed(1)
    model = TransformerNFN(spec, recipe=recipe).double().eval()
    weights = TransformerWeights.from_params(torch.randn(4, spec.n_params, dtype=torch.float64) * 0.3, spec)
    g = sample_group_element(spec, torch.Generator().manual_seed(2))
    base, moved = model.forward_logits(weights), model.forward_logits(g.act(weights))
    assert ((moved - base).abs().max() / base.abs().max()).item() < 1e-9


class HeadwiseLayer(EquivariantLayer):
    """The same layer with one W_q mixing matrix per head instead of one shared: not equivariant."""

    def forward(self, x: BlockStack) -> BlockStack:
        out = super().forward(x)
        heads = out["W_q"].shape[3]
        scale = torch.arange(1, heads + 1, dtype=out["W_q"].dtype).view(1, 1, 1, heads, 1, 1)
        return BlockStack({**out.tensors, "W_q": out["W_q"] * scale})


def test_an_unconstrained_layer_fails_the_check() -> None:
    torch.manual_seed(3)
    layer = HeadwiseLayer(ZOO, 1, 2).double()
    x = random_stack(ZOO, 2, 1, 3)
    g = sample_group_element(ZOO, torch.Generator().manual_seed(4))
    while torch.equal(g.blocks[0].sigma, torch.arange(ZOO.num_heads)):
        g = sample_group_element(ZOO, torch.Generator().manual_seed(int(torch.randint(0, 999, (1,)))))
    assert max_relative_error(layer(act(g, x)), act(g, layer(x))) > 1e-3


def test_activations_stay_in_range_through_layers() -> None:
    """Unit-variance weights in, several layers deep: every tensor's scale stays within a factor of ~10."""
    torch.manual_seed(5)
    x = BlockStack({k: v.float() for k, v in random_stack(ZOO, 8, 1, 5).tensors.items()})
    layers = [EquivariantLayer(ZOO, 1, 8)] + [EquivariantLayer(ZOO, 8, 8) for _ in range(4)]
    for depth, layer in enumerate(layers, start=1):
        with torch.no_grad():
            x = layer(x).map_mlp(torch.relu)
        for name, tensor in x.tensors.items():
            rms = tensor.float().pow(2).mean().sqrt().item()
            assert 0.1 < rms < 10, f"layer {depth}: {name} has rms {rms:.3g}"


def test_paper_setting_has_about_1_8_million_parameters() -> None:
    count = count_parameters(TransformerNFN(ZOO, channels=10, hidden=10))
    assert 1_700_000 < count < 1_900_000, count
    assert count_parameters(TransformerNFN(ZOO, components=("classifier",))) < 20_000


def test_mismatched_inputs_are_named() -> None:
    model = TransformerNFN(ZOO)
    other = ArchitectureSpec("vision", 10, num_heads=4, d_head=8)
    with pytest.raises(ValueError, match="num_heads=4, this model was built for num_heads=2"):
        model(TransformerWeights.from_params(torch.zeros(2, other.n_params), other))
    weights = TransformerWeights.from_params(torch.zeros(2, ZOO.n_params), ZOO)
    weights.blocks[1].W_A = torch.zeros(2, 1, 32, 65)
    with pytest.raises(ValueError, match=r"tensor W_A has shape|blocks\[1\]"):
        model(weights)
    with pytest.raises(ValueError, match="components"):
        TransformerNFN(ZOO, components=("decoder",))


@pytest.mark.parametrize("recipe", ["package", "paper"])
def test_the_single_layer_encoder_shortcut_is_the_full_computation(recipe: str) -> None:
    """With one equivariant layer, the encoder reads only summaries of its output, computed without forming it
    (fused sums that keep sign masks); outputs and every parameter's gradient equal the full computation's."""
    torch.manual_seed(0)
    model = TransformerNFN(ZOO, recipe=recipe).double()
    stack = random_stack(ZOO, 5, 1, 11)
    weight = torch.randn(5, ZOO.num_blocks * 10, dtype=torch.float64)

    def run(encode) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad()
        out = encode(stack)
        (out * weight).sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.encoder.named_parameters()}

    fast, fast_grads = run(model.encoder)
    full, full_grads = run(lambda s: model.encoder.invariant(model.encoder.equivariant(s)))
    assert torch.allclose(fast, full, rtol=1e-12, atol=1e-14)
    for name in full_grads:
        assert torch.allclose(fast_grads[name], full_grads[name], rtol=1e-10, atol=1e-14), name
