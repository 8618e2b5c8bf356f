"""Alignment to a reference by weight matching (`weights.align`): the function of every checkpoint is kept, a
permuted copy of the reference aligns back to it exactly, the result does not depend on the run, and the bench's
`--preprocess align` is fitted on the training split alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from small_transformer_zoo.format.architecture import mnist_spec, text_spec
from small_transformer_zoo.weights.align import Permutations, align_params, reference_row
from small_transformer_zoo.weights.model import ZooTransformer
from small_transformer_zoo.weights.weight_space import TransformerWeights
from tests.helpers import TEXT, random_inputs

SPECS = {"vision": mnist_spec(), "text": TEXT}


def _logits(spec, row: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    model = ZooTransformer(spec).double().eval()
    model.load_state_dict(TransformerWeights.from_params(row.reshape(1, -1), spec).state_dict(0), strict=False)
    if spec.modality == "text":  # the frozen word table, the same for both checkpoints compared
        model.embedding.table.copy_(torch.randn(spec.vocab_size, spec.d_model, dtype=torch.float64,
                                                generator=torch.Generator().manual_seed(0)))
    with torch.no_grad():
        return model(inputs)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), modality=st.sampled_from(sorted(SPECS)))
def test_aligned_checkpoints_compute_the_same_function(seed: int, modality: str) -> None:
    spec = SPECS[modality]
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(3, spec.n_params, generator=generator, dtype=torch.float64) * 0.3
    aligned = align_params(rows[1:], rows[0], spec)
    inputs = random_inputs(spec, 6, generator)
    for before, after in zip(rows[1:], aligned):
        assert (after != before).any(), "alignment moved the unrelated checkpoint"
        assert torch.allclose(_logits(spec, after, inputs), _logits(spec, before, inputs), rtol=0, atol=1e-10)
        assert (after * rows[0]).sum() >= (before * rows[0]).sum(), "no further from the reference"


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), modality=st.sampled_from(sorted(SPECS)))
def test_a_permuted_copy_of_the_reference_aligns_back_to_it_exactly(seed: int, modality: str) -> None:
    spec = SPECS[modality]
    reference = torch.randn(1, spec.n_params, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    weights = TransformerWeights.from_params(reference, spec)
    moved = Permutations.random(spec, np.random.default_rng(seed)).act(weights).to_params()
    assert not torch.equal(moved, reference)
    assert torch.equal(align_params(moved, reference[0], spec), reference)


def test_alignment_is_deterministic_and_row_by_row() -> None:
    spec = mnist_spec()
    rows = torch.randn(5, spec.n_params, generator=torch.Generator().manual_seed(3)) * 0.2
    first = align_params(rows, rows[0], spec)
    assert torch.equal(first, align_params(rows, rows[0], spec))
    assert torch.equal(first[2:3], align_params(rows[2:3], rows[0], spec)), "a row's alignment ignores the others"
    assert first.dtype == torch.float32


def test_the_reference_is_the_training_checkpoint_of_median_norm() -> None:
    rows = torch.diag(torch.tensor([5.0, 1.0, 3.0, 0.01, 4.0]))
    assert reference_row(rows) == 2
    assert reference_row(rows[:4]) == 1, "the lower of two middles"


def test_bench_align_is_fitted_on_training_data_only(synthetic_root) -> None:
    from nfn_baselines.bench.data import load_bench_data

    raw = load_bench_data(synthetic_root, "syn")
    aligned = load_bench_data(synthetic_root, "syn", preprocess="align")
    reference = raw.splits["train"].params[reference_row(raw.splits["train"].params)]
    assert aligned.preprocess == "align"
    for name in ("train", "test"):
        assert torch.equal(aligned.splits[name].params, align_params(raw.splits[name].params, reference, raw.spec))
