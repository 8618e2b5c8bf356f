"""The `nearest_run` floor: blockwise distances give the brute-force nearest training row by direction, and a
collapsed training network of tiny norm is not everyone's nearest."""

from types import SimpleNamespace

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nfn_baselines.models.floors import NearestRun


@settings(max_examples=40, deadline=None)
@given(train_rows=st.integers(1, 23), query_rows=st.integers(0, 17), width=st.integers(1, 9),
       chunks=st.tuples(st.integers(1, 5), st.integers(1, 7)), seed=st.integers(0, 2**16),
       repeat=st.booleans())
def test_blockwise_nearest_is_the_brute_force_nearest(train_rows: int, query_rows: int, width: int,
                                                      chunks: tuple[int, int], seed: int, repeat: bool) -> None:
    generator = torch.Generator().manual_seed(seed)
    train = torch.randn(train_rows, width, generator=generator)
    if repeat and train_rows > 1:
        train[-1] = train[0]  # a tie across blocks: either row is nearest
    query = torch.randn(query_rows, width, generator=generator)
    if query_rows:
        query[0] = train[-1]
    floor = NearestRun(SimpleNamespace(params=train, target=np.arange(train_rows, dtype=float)))
    floor.QUERY_CHUNK, floor.TRAIN_CHUNK = chunks
    found = floor.nearest(query)
    unit = lambda rows: rows.double() / rows.double().norm(dim=1, keepdim=True)  # noqa: E731
    distance = torch.cdist(unit(query), unit(train)).numpy()
    assert found.shape == (query_rows,)
    assert np.allclose(distance[np.arange(query_rows), found], distance.min(1) if query_rows else 0, atol=1e-9)
    if not repeat:
        assert np.array_equal(found, distance.argmin(1))
    assert floor.params.dtype == torch.float32  # the training split is not widened whole


def test_on_its_own_training_split_each_checkpoint_is_its_own_nearest() -> None:
    train = SimpleNamespace(params=torch.randn(30, 6, generator=torch.Generator().manual_seed(1)),
                            target=np.linspace(0, 1, 30))
    floor = NearestRun(train)
    assert np.array_equal(floor.predict(train), train.target)
    copy = SimpleNamespace(params=train.params.clone(), target=train.target)  # the same rows by search
    assert np.array_equal(floor.predict(copy), train.target)
    assert np.array_equal(floor.nearest(train.params), np.arange(30))


def test_collapsed_networks_of_tiny_norm_are_not_everyones_nearest() -> None:
    """Unrelated networks of ordinary norm and a few collapsed ones (norm 0.3 against 24): by Euclidean distance
    every query would be nearest to a collapsed one; by direction, a query's near-clone is found and unrelated
    queries spread over the training rows."""
    generator = torch.Generator().manual_seed(0)
    ordinary = torch.randn(40, 500, generator=generator)
    ordinary *= 24 / ordinary.norm(dim=1, keepdim=True)
    collapsed = torch.randn(4, 500, generator=generator)
    collapsed *= 0.3 / collapsed.norm(dim=1, keepdim=True)
    train = torch.cat([ordinary, collapsed])
    floor = NearestRun(SimpleNamespace(params=train, target=np.arange(44, dtype=float)))
    unrelated = torch.randn(300, 500, generator=generator) * 24 / np.sqrt(500)
    assert set(torch.cdist(unrelated, train).argmin(1).tolist()) <= set(range(40, 44)), "Euclidean's bias"
    collapsed_share = float(np.mean(floor.nearest(unrelated) >= 40))
    assert collapsed_share < 0.2, "about their 4 in 44 rows, not all of them"
    clone = ordinary[7:8] * 1.001 + 0.01 * torch.randn(1, 500, generator=generator)
    assert floor.nearest(clone).tolist() == [7]
