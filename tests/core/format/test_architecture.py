import pytest
import torch

from small_transformer_zoo.format.architecture import ArchitectureSpec, mnist_spec, text_spec
from small_transformer_zoo.weights.model import ZooTransformer


def test_mnist_parameter_count_matches_the_paper() -> None:
    spec = mnist_spec()
    assert spec.n_params == 18_506
    by_component = {}
    for p in spec.parameters():
        by_component[spec.component(p.name)] = by_component.get(spec.component(p.name), 0) + p.numel
    assert by_component == {"embedding": 544, "encoder": 2 * 8_288, "classifier": 1_386}


@pytest.mark.parametrize("spec", [mnist_spec(), text_spec(vocab_size=50, max_length=12),
                                  ArchitectureSpec("vision", 3, num_heads=4, num_blocks=3, d_mlp=16)])
def test_spec_layout_is_the_module_tree(spec: ArchitectureSpec) -> None:
    model = ZooTransformer(spec)
    module = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    assert module == [(p.name, p.shape) for p in spec.parameters()]
    assert sum(p.numel() for p in model.parameters()) == spec.n_params
    assert list(model.state_dict()) == [p.name for p in spec.parameters()]


def test_text_model_masks_padding() -> None:
    spec = text_spec(vocab_size=20, max_length=8)
    torch.manual_seed(0)
    model = ZooTransformer(spec).eval()
    model.embedding.table.normal_()
    short = torch.tensor([[5, 6, 7, 0, 0, 0, 0, 0]])
    # Padding must not change the prediction: the same text padded to a shorter length gives the same logits.
    assert torch.allclose(model(short), model(short[:, :4]), atol=1e-6)
    assert torch.isfinite(model(torch.zeros(1, 8, dtype=torch.long))).all()


def test_bad_spec_is_named() -> None:
    with pytest.raises(ValueError, match="modality"):
        ArchitectureSpec("audio", 10)
    with pytest.raises(ValueError, match="vocab_size"):
        ArchitectureSpec("text", 4)
    with pytest.raises(ValueError, match="unknown architecture fields"):
        ArchitectureSpec.from_dict({**mnist_spec().to_dict(), "depth": 3})


def test_a_checkpoint_stores_every_component_but_a_text_zoos_frozen_embedding() -> None:
    vision = mnist_spec()
    text = ArchitectureSpec("text", num_classes=4, vocab_size=50, max_length=16)
    assert vision.stored_components == ("encoder", "embedding", "classifier")
    assert text.stored_components == ("encoder", "classifier")
    assert not any(p.name.startswith("embedding.") for p in text.parameters())
