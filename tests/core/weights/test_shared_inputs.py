"""Many checkpoints on shared inputs at once: the batched forward is each checkpoint's own `ZooTransformer`."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from small_transformer_zoo.format.architecture import ArchitectureSpec, mnist_spec
from small_transformer_zoo.weights.model import ZooTransformer, image_patches
from small_transformer_zoo.weights.shared_inputs import logits_on_shared_inputs
from small_transformer_zoo.weights.weight_space import TransformerWeights

VISION = st.one_of(
    st.just(mnist_spec()),
    st.builds(ArchitectureSpec, modality=st.just("vision"), num_classes=st.integers(2, 5),
              d_model=st.sampled_from([4, 6]), num_heads=st.integers(1, 3), d_head=st.integers(1, 4),
              d_mlp=st.integers(2, 7), num_blocks=st.integers(1, 3), image_size=st.just(8),
              in_channels=st.integers(1, 3), patch_size=st.sampled_from([2, 4])))
TEXT = st.builds(ArchitectureSpec, modality=st.just("text"), num_classes=st.integers(2, 5), d_model=st.just(6),
                 num_heads=st.integers(1, 3), d_head=st.integers(1, 3), d_mlp=st.integers(2, 6),
                 num_blocks=st.integers(1, 2), vocab_size=st.just(30), max_length=st.integers(2, 9))


def checkpoints(spec: ArchitectureSpec, count: int, seed: int) -> TransformerWeights:
    params = torch.randn(count, spec.n_params, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    return TransformerWeights.from_params(params * 0.4, spec)


@settings(max_examples=20, deadline=None)
@given(spec=st.one_of(VISION, TEXT), batch=st.integers(1, 4), inputs=st.integers(1, 5), seed=st.integers(0, 10_000))
def test_every_checkpoint_computes_what_its_own_network_computes(spec: ArchitectureSpec, batch: int, inputs: int,
                                                                 seed: int) -> None:
    weights = checkpoints(spec, batch, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    network = ZooTransformer(spec).double().eval()
    if spec.modality == "vision":
        x = torch.randn(inputs, spec.in_channels, spec.image_size, spec.image_size, generator=generator,
                        dtype=torch.float64)
        run = network
    else:
        x = torch.randn(inputs, spec.num_tokens, spec.d_model, generator=generator, dtype=torch.float64)
        run = network.forward_embedded
    logits = logits_on_shared_inputs(weights, x)
    assert logits.shape == (batch, inputs, spec.num_classes)
    for i in range(batch):
        network.load_state_dict(weights.state_dict(i), strict=False)
        torch.testing.assert_close(logits[i], run(x), rtol=1e-10, atol=1e-10)


def test_gradients_reach_the_inputs_and_every_checkpoint() -> None:
    spec = mnist_spec()
    weights = checkpoints(spec, 3, 0).map(lambda t: t.detach().requires_grad_())
    images = torch.randn(2, 1, 28, 28, dtype=torch.float64, requires_grad=True)
    logits_on_shared_inputs(weights, images).sum().backward()
    assert images.grad is not None and images.grad.abs().sum() > 0
    assert all(t.grad is not None and t.grad[i].abs().sum() > 0 for t in weights.blocks[0].as_dict().values()
               for i in range(3))


def test_a_many_channel_weight_space_is_refused() -> None:
    one = checkpoints(mnist_spec(), 2, 0)
    weights = TransformerWeights(one.spec, [b.map(lambda t: torch.cat([t, t], dim=1)) for b in one.blocks],
                                 one.embedding, one.classifier)
    with pytest.raises(ValueError, match="one-channel weight space runs as networks, this has 2"):
        logits_on_shared_inputs(weights, torch.zeros(1, 1, 28, 28, dtype=torch.float64))


@settings(max_examples=25, deadline=None)
@given(lead=st.lists(st.integers(1, 3), max_size=2), channels=st.integers(1, 3), patch=st.sampled_from([1, 2, 4]),
       grid=st.integers(1, 3), seed=st.integers(0, 10_000))
def test_image_patches_times_the_flattened_kernel_is_the_patch_convolution(lead: list[int], channels: int,
                                                                          patch: int, grid: int, seed: int) -> None:
    """`image_patches` orders each patch as the convolution's kernel does, for any leading dimensions (the builder
    stacks runs and batches in front, the probes have one)."""
    generator = torch.Generator().manual_seed(seed)
    size = patch * grid
    images = torch.randn(*lead, channels, size, size, dtype=torch.float64, generator=generator)
    conv = torch.nn.Conv2d(channels, 5, patch, stride=patch).double()
    expected = conv(images.reshape(-1, channels, size, size)).flatten(2).transpose(1, 2)
    got = image_patches(images, patch) @ conv.weight.reshape(5, -1).T + conv.bias
    assert got.shape == (*lead, grid * grid, 5)
    torch.testing.assert_close(got.reshape(expected.shape), expected, rtol=0, atol=1e-12)
