import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from small_transformer_zoo.format.architecture import ArchitectureSpec, mnist_spec, text_spec
from small_transformer_zoo.weights.model import ZooTransformer
from small_transformer_zoo.weights.collate import WeightSpaceCollator
from small_transformer_zoo.weights.weight_space import TransformerWeights, block_shapes, pack_state_dict

specs = st.builds(
    ArchitectureSpec,
    modality=st.just("vision"),
    num_classes=st.integers(2, 5),
    d_model=st.sampled_from([4, 8]),
    num_heads=st.integers(1, 4),
    d_head=st.integers(1, 5),
    d_mlp=st.integers(1, 6),
    num_blocks=st.integers(1, 3),
    image_size=st.just(8),
    patch_size=st.just(4),
)


@settings(max_examples=30, deadline=None)
@given(spec=specs, batch=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_packed_rows_round_trip_through_the_nfn_layout(spec: ArchitectureSpec, batch: int, seed: int) -> None:
    params = torch.randn(batch, spec.n_params, generator=torch.Generator().manual_seed(seed))
    weights = TransformerWeights.from_params(params, spec)
    weights.validate()
    assert torch.equal(weights.to_params(), params)
    shapes = block_shapes(spec)
    for block in weights.blocks:
        for name, tensor in block.as_dict().items():
            assert tuple(tensor.shape) == (batch, 1, *shapes[name])


def test_nfn_layout_is_right_multiplication_per_head() -> None:
    """X @ W_q[i] is head i's query in the real module, and the head outputs through W_o rebuild o_proj."""
    spec = mnist_spec()
    torch.manual_seed(1)
    model = ZooTransformer(spec).double()
    row = torch.from_numpy(pack_state_dict(model.state_dict(), spec)).double()[None]
    block = TransformerWeights.from_params(row, spec).blocks[0]
    attn = model.blocks[0].attn
    x = torch.randn(7, spec.d_model, dtype=torch.float64)
    q = attn.q_proj(x).view(7, spec.num_heads, spec.d_head)
    v = attn.v_proj(x).view(7, spec.num_heads, spec.d_head)
    for i in range(spec.num_heads):
        assert torch.allclose(x @ block.W_q[0, 0, i], q[:, i])
    recombined = sum(v[:, i] @ block.W_o[0, 0, i] for i in range(spec.num_heads))
    assert torch.allclose(recombined, attn.o_proj(v.reshape(7, -1)))
    h = torch.randn(5, spec.d_model, dtype=torch.float64)
    assert torch.allclose(h @ block.W_A[0, 0] + block.b_A[0, 0], model.blocks[0].mlp.fc1(h))


@pytest.mark.parametrize("spec", [mnist_spec(), text_spec(vocab_size=30, max_length=6)])
def test_weight_space_back_to_a_state_dict_gives_the_same_model(spec: ArchitectureSpec) -> None:
    torch.manual_seed(2)
    models = [ZooTransformer(spec).eval() for _ in range(3)]
    rows = torch.from_numpy(np.stack([pack_state_dict(m.state_dict(), spec) for m in models]))
    weights = TransformerWeights.from_params(rows, spec)
    inputs = torch.randn(4, 1, 28, 28) if spec.modality == "vision" else torch.randint(0, 30, (4, 6))
    for index, original in enumerate(models):
        rebuilt = ZooTransformer(spec).eval()
        rebuilt.load_state_dict(weights.state_dict(index))
        if spec.modality == "text":
            rebuilt.embedding.table.copy_(original.embedding.table)
        assert torch.equal(rebuilt(inputs), original(inputs))


def test_pack_state_dict_names_the_bad_tensor() -> None:
    spec = mnist_spec()
    state = ZooTransformer(spec).state_dict()
    state["blocks.1.mlp.fc1.bias"] = torch.zeros(65)
    with pytest.raises(ValueError, match=r"blocks.1.mlp.fc1.bias.*\(65,\).*\(64,\)"):
        pack_state_dict(state, spec)
    del state["blocks.1.mlp.fc1.bias"]
    with pytest.raises(ValueError, match="missing.*blocks.1.mlp.fc1.bias"):
        pack_state_dict(state, spec)


def test_validate_names_tensor_and_shapes() -> None:
    spec = mnist_spec()
    weights = TransformerWeights.from_params(torch.zeros(2, spec.n_params), spec)
    other = ArchitectureSpec("vision", 10, num_heads=4, d_head=8)
    weights.spec = other
    with pytest.raises(ValueError, match=r"blocks\[0\]\.W_q has shape \(2, 1, 2, 32, 16\).*4, 32, 8"):
        weights.validate()
    with pytest.raises(ValueError, match=r"shape \[batch, 18506\]"):
        TransformerWeights.from_params(torch.zeros(2, 100), spec)


def test_collator_builds_a_batch_from_rows() -> None:
    spec = mnist_spec()
    rows = [{"params": np.full(spec.n_params, k, np.float32), "test_accuracy": k / 10, "checkpoint_id": f"c{k}"}
            for k in range(3)]
    batch = WeightSpaceCollator(spec)(rows)
    assert batch.checkpoint_ids == ["c0", "c1", "c2"]
    assert torch.allclose(batch.labels, torch.tensor([0.0, 0.1, 0.2]))
    assert torch.equal(batch.weights.blocks[1].b_B[:, 0, 0], torch.tensor([0.0, 1.0, 2.0]))
    assert math.isclose(float(batch.weights.to_params()[2].mean()), 2.0)


def test_state_dict_tensors_own_their_storage() -> None:
    """A state_dict taken from a big batch must not drag the batch along when saved."""
    spec = mnist_spec()
    weights = TransformerWeights.from_params(torch.randn(64, spec.n_params), spec)
    for tensor in weights.state_dict(3).values():
        assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
