"""Training Transformer-NFN: it learns a learnable target, selects on validation, and is deterministic by seed."""

import math

import pytest
import torch

from nfn_baselines.models.baselines import FlatPredictor
from nfn_baselines.models.model import TransformerNFN
from nfn_baselines.models.train import TrainConfig, predict, prepare, train_predictor, train_predictors, warmup_cosine
from small_transformer_zoo.format.architecture import mnist_spec
from small_transformer_zoo.testing.labelled_weights import shifted_bias_weights
from small_transformer_zoo.weights.weight_space import TransformerWeights

SPEC = mnist_spec()


def test_warmup_then_cosine() -> None:
    f = warmup_cosine(100, 10)
    assert math.isclose(f(0), 0.1) and math.isclose(f(10), 1.0) and f(55) < 1.0 and f(100) < 1e-9
    assert all(f(i) <= f(i - 1) + 1e-12 for i in range(11, 100))


@pytest.mark.slow
def test_nfn_learns_and_is_deterministic() -> None:
    train, validation = shifted_bias_weights(SPEC, 160, 0), shifted_bias_weights(SPEC, 60, 1)
    config = TrainConfig(epochs=4, warmup_epochs=1, seed=3)
    torch.manual_seed(0)
    first = train_predictor(TransformerNFN(SPEC, components=("encoder",)), SPEC, train, validation, config)
    assert first.best_validation_tau > 0.5, first.history
    assert first.best_epoch == max(first.history, key=lambda r: r["validation_tau"])["epoch"]
    torch.manual_seed(0)
    second = train_predictor(TransformerNFN(SPEC, components=("encoder",)), SPEC, train, validation, config)
    assert [r["train_loss"] for r in first.history] == [r["train_loss"] for r in second.history]
    predictions = predict(first.model, validation[0], SPEC)
    assert predictions.shape == (60,) and ((predictions > 0) & (predictions < 1)).all()


class FlatProbe(torch.nn.Module):
    """A model that is not invariant: a linear map of the first block's flattened W_q."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(SPEC.num_heads * SPEC.d_model * SPEC.d_head, 1)

    def forward_logits(self, weights: TransformerWeights) -> torch.Tensor:
        return self.linear(weights.blocks[0].W_q.flatten(1)).squeeze(-1)

    def forward(self, weights: TransformerWeights) -> torch.Tensor:
        return torch.sigmoid(self.forward_logits(weights))


def test_augmentation_by_group_elements() -> None:
    """It changes what a non-invariant model sees, and is a no-op (to round-off) for the invariant NFN."""
    train, validation = shifted_bias_weights(SPEC, 48, 2), shifted_bias_weights(SPEC, 20, 3)

    def loss(model_class, augment: bool) -> float:
        torch.manual_seed(0)
        result = train_predictor(model_class(), SPEC, train, validation, TrainConfig(epochs=1, augment=augment))
        return result.history[0]["train_loss"]

    assert abs(loss(FlatProbe, True) - loss(FlatProbe, False)) > 1e-4
    nfn = lambda: TransformerNFN(SPEC)  # noqa: E731
    assert abs(loss(nfn, True) - loss(nfn, False)) < 1e-5


class CountedStatNN(FlatPredictor):
    """STATNN that counts the checkpoints its first step sees."""

    prepared_rows = 0

    def prepare(self, params: torch.Tensor) -> tuple[torch.Tensor, ...]:
        CountedStatNN.prepared_rows += len(params)
        return super().prepare(params)


def test_inputs_prepared_once_train_as_inputs_prepared_inside() -> None:
    """`train_predictors(prepared=...)` skips the first step on both splits and trains exactly as without it."""
    train, validation = shifted_bias_weights(SPEC, 64, 4), shifted_bias_weights(SPEC, 24, 5)
    configs = [TrainConfig(epochs=2, warmup_epochs=1, seed=seed) for seed in (0, 1)]

    def fit(prepared: tuple | None) -> list:
        torch.manual_seed(0)
        models = [CountedStatNN(SPEC, "statnn") for _ in configs]
        CountedStatNN.prepared_rows = 0
        return train_predictors(models, SPEC, train, validation, configs, prepared=prepared)

    inside = fit(None)
    assert CountedStatNN.prepared_rows == 64 + 24
    given = (prepare(FlatPredictor(SPEC, "statnn"), train[0]), prepare(FlatPredictor(SPEC, "statnn"), validation[0]))
    once = fit(given)
    assert CountedStatNN.prepared_rows == 0
    for a, b in zip(inside, once):
        assert a.history == b.history and a.best_epoch == b.best_epoch
        assert torch.equal(a.model.head[1].weight, b.model.head[1].weight)
    with pytest.raises(ValueError, match="prepared validation inputs of \\[23\\] rows for 24 checkpoints"):
        fit((given[0], tuple(t[:23] for t in given[1])))


@pytest.mark.parametrize("recipe", ["package", "paper"])
def test_nfns_trained_together_under_vmap_train_as_each_alone(recipe: str) -> None:
    """Several Transformer-NFNs in one `train_predictors` call (one `torch.func.vmap` over them, as the benchmark
    trains seeds on a GPU) run the invariant layer's custom autograd functions batched and end as each trained
    alone, loss for loss and weight for weight."""
    train, validation = shifted_bias_weights(SPEC, 48, 6), shifted_bias_weights(SPEC, 16, 7)
    configs = [TrainConfig(epochs=2, warmup_epochs=1, seed=seed, batch_size=16) for seed in (0, 1)]

    def built(seed: int) -> TransformerNFN:
        torch.manual_seed(seed)
        return TransformerNFN(SPEC, recipe=recipe)

    together = train_predictors([built(10), built(11)], SPEC, train, validation, configs)
    for seed, config, joint in zip((10, 11), configs, together):
        alone = train_predictors([built(seed)], SPEC, train, validation, [config])[0]
        for a, b in zip(joint.history, alone.history):
            assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4, abs=1e-6)
        for (name, a), b in zip(joint.model.state_dict().items(), alone.model.state_dict().values()):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5, msg=name)
