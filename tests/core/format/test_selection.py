"""Selection by metadata (`where=`): the fast path and `load_dataset` (prepared and streaming) pick the same
checkpoints as a plain filter of the metadata rows, and read only the selected rows' bytes."""

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from small_transformer_zoo import Zoo, load_dataset
from small_transformer_zoo.hub.hf_builder import read_row_runs
from small_transformer_zoo.format.shards import open_header

WHERES = [
    ({"optimizer": "adam"}, lambda r: r["optimizer"] == "adam"),
    ({"learning_rate": (1e-3, 1e-2), "epoch": [1, 10]},
     lambda r: 1e-3 <= r["learning_rate"] <= 1e-2 and r["epoch"] in (1, 10)),
    ({"test_accuracy": (0.5, None), "is_best": False}, lambda r: r["test_accuracy"] >= 0.5 and not r["is_best"]),
    ({"train_loss": None, "epoch": 1}, lambda r: r["train_loss"] is None and r["epoch"] == 1),
    ({"optimizer": {"sgd", "rmsprop"}, "dropout": (None, 0.1)},
     lambda r: r["optimizer"] in ("sgd", "rmsprop") and r["dropout"] <= 0.1),
]


@pytest.mark.parametrize("case", range(len(WHERES)))
def test_every_read_path_selects_what_a_plain_filter_selects(case: int, synthetic_root: Path, tmp_path: Path,
                                                             stz_home: Path) -> None:
    where, keep = WHERES[case]
    zoo = Zoo.open(synthetic_root, "syn")
    rows = zoo.metadata("train").to_pylist()
    expected = [r["checkpoint_id"] for r in rows if keep(r)]
    weights, meta = zoo.weight_space("train", where=where)
    assert meta.column("checkpoint_id").to_pylist() == expected
    full = zoo.split_weights("train")
    by_id = dict(zip(full.metadata.column("checkpoint_id").to_pylist(), full.to_tensor()))
    loaded = load_dataset(str(synthetic_root), "syn", split="train", where=where,
                          cache_dir=str(tmp_path / "cache")).with_format("torch")
    streamed = list(load_dataset(str(synthetic_root), "syn", split="train", where=where, streaming=True))
    assert loaded["checkpoint_id"] == [r["checkpoint_id"] for r in streamed] == expected
    assert expected, "each case selects some checkpoints"
    for cid, params in zip(loaded["checkpoint_id"], loaded["params"]):
        assert torch.equal(params, by_id[cid])
    assert weights.to_params().shape[0] == len(expected)


def test_a_selection_reads_only_its_rows(synthetic_root: Path) -> None:
    zoo = Zoo.open(synthetic_root, "syn")
    path = zoo.dir / zoo.shard_paths("train")[0]
    header = open_header(path)

    class Counting(io.FileIO):
        read_bytes = 0

        def read(self, size: int = -1) -> bytes:
            data = super().read(size)
            Counting.read_bytes += len(data)
            return data

    with Counting(path, "rb") as handle:
        block = read_row_runs(handle, header, np.array([1, 2, 6]))
    assert Counting.read_bytes == 3 * header.row_bytes
    expected = zoo.split_weights("train").shards[0][[1, 2, 6]]
    assert torch.equal(torch.from_numpy(block.copy()), expected)


def test_bad_filters_are_clear_errors(synthetic_root: Path) -> None:
    zoo = Zoo.open(synthetic_root, "syn")
    with pytest.raises(ValueError, match="where: unknown column 'lr'; metadata columns are"):
        zoo.select("train", where={"lr": 1e-3})
    with pytest.raises(ValueError, match=r"a range is a \(low, high\) pair"):
        zoo.select("train", where={"learning_rate": (1, 2, 3)})
    with pytest.raises(ValueError, match="where: unknown column"):
        load_dataset(str(synthetic_root), "syn", split="train", where={"nope": 1})
    with pytest.raises(ValueError, match=r"where\['optimizer'\]: unknown value 'none-such'; column 'optimizer' holds one of"):
        zoo.select("train", where={"optimizer": "none-such"})
    with pytest.raises(ValueError, match=r"where\['split'\]: unknown value"):
        load_dataset(str(synthetic_root), "syn", split="train", where={"split": "none-such"})
    nothing = {"learning_rate": (10.0, 20.0)}
    assert len(zoo.select("train", where=nothing)) == 0
    empty, _ = zoo.weight_space("train", where=nothing)
    assert empty.to_params().shape == (0, zoo.spec.n_params)
    assert load_dataset(str(synthetic_root), "syn", split="train", where=nothing).num_rows == 0


COLUMN_VALUES = {
    "optimizer": ["sgd", "sgd_momentum", "adam", "rmsprop"],
    "epoch": [1, 5, 10],
    "dropout": [0.0, 0.05, 0.1, 0.15, 0.2],
    "is_best": [True, False],
}
filters = st.fixed_dictionaries({}, optional={
    "where": st.dictionaries(st.sampled_from(sorted(COLUMN_VALUES)), st.one_of(
        st.sampled_from(["eq"]), st.sampled_from(["in"])), max_size=2),
    "min_accuracy": st.floats(0.0, 0.9).map(lambda v: round(v, 2)),
    "max_accuracy": st.floats(0.3, 1.0).map(lambda v: round(v, 2)),
    "epochs": st.lists(st.sampled_from([1, 5, 10]), min_size=1, max_size=2, unique=True),
    "best_only": st.booleans(),
    "include_diverged": st.booleans(),
    "distinct": st.booleans(),
})


def _concrete(drawn: dict, data: st.DataObject) -> dict:
    """The drawn filter with its `where` values chosen (equality or membership per column)."""
    out = {k: v for k, v in drawn.items() if k != "where"}
    where = {}
    for column, kind in drawn.get("where", {}).items():
        values = COLUMN_VALUES[column]
        where[column] = (data.draw(st.sampled_from(values)) if kind == "eq" else
                         data.draw(st.lists(st.sampled_from(values), min_size=1, max_size=3, unique=True)))
    if where:
        out["where"] = where
    return out


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=filters, data=st.data())
def test_one_selection_rule_on_every_read_path(drawn: dict, data: st.DataObject, synthetic_root: Path,
                                               tmp_path_factory: pytest.TempPathFactory) -> None:
    """Drawn filters give the same checkpoints, in the same order, with the same bytes, on the fast path,
    through `load_dataset` (prepared and streaming) and in the benchmark's data loader."""
    from nfn_baselines.bench.data import _read_split
    from nfn_baselines.models.targets import get_target

    selection = _concrete(drawn, data)
    zoo = Zoo.open(synthetic_root, "syn")
    if selection.get("min_accuracy", 0) > selection.get("max_accuracy", 1):
        for read in (lambda: zoo.weight_space("train", **selection),
                     lambda: load_dataset(str(synthetic_root), "syn", split="train", **selection)):
            with pytest.raises(ValueError, match="the range is reversed"):
                read()
        return
    weights, meta = zoo.weight_space("train", **selection)
    ids = meta.column("checkpoint_id").to_pylist()
    params = weights.to_params()
    cache = str(tmp_path_factory.mktemp("cache"))
    loaded = load_dataset(str(synthetic_root), "syn", split="train", cache_dir=cache, **selection).with_format("torch")
    streamed = list(load_dataset(str(synthetic_root), "syn", split="train", streaming=True, **selection))
    assert list(loaded["checkpoint_id"]) == [r["checkpoint_id"] for r in streamed] == ids
    if ids:
        assert torch.equal(loaded[:]["params"], params)
        assert torch.equal(torch.stack([torch.as_tensor(r["params"]) for r in streamed]), params)
    bench_where = dict(selection.get("where", {}))  # the benchmark's loader takes `where`: the shorthands as it
    shorthands = {"test_accuracy": (selection.get("min_accuracy"), selection.get("max_accuracy"))
                  if {"min_accuracy", "max_accuracy"} & set(selection) else None,
                  "epoch": selection.get("epochs"), "is_best": True if selection.get("best_only") else None}
    if any(k in bench_where for k, v in shorthands.items() if v is not None) or \
            selection.get("include_diverged") or selection.get("distinct") is False:
        return
    bench_where |= {k: v for k, v in shorthands.items() if v is not None}
    split = _read_split(zoo, "train", bench_where, get_target("test_accuracy"))
    assert split.metadata.column("checkpoint_id").to_pylist() == ids
    assert torch.equal(split.params, params)


def _ordered(bounds: tuple) -> tuple:
    """A range with its ends in order (a reversed one is refused: `test_a_reversed_range_names_itself`)."""
    return tuple(sorted(bounds)) if None not in bounds else bounds


stored_values = {"optimizer": st.sampled_from(COLUMN_VALUES["optimizer"]), "epoch": st.integers(1, 100),
                 "dropout": st.floats(0, 1), "is_best": st.booleans()}
stored_wheres = st.dictionaries(st.sampled_from(sorted(stored_values)), st.just(None), max_size=4).flatmap(
    lambda columns: st.fixed_dictionaries({c: st.one_of(
        stored_values[c], st.lists(stored_values[c], min_size=1, max_size=3), st.just(None),
        st.tuples(st.one_of(st.none(), stored_values[c]), st.one_of(st.none(), stored_values[c])).map(_ordered))
        for c in columns}))


@settings(max_examples=60, deadline=None)
@given(where=stored_wheres)
def test_a_selection_stored_as_json_reads_back_as_the_same_selection(where: dict) -> None:
    """`where_of` inverts `normalise_where` through JSON (a leaderboard claim), condition for condition."""
    import json

    from small_transformer_zoo.format.selection import normalise_where, where_of

    stored = json.loads(json.dumps(normalise_where(where)))
    assert normalise_where(where_of(stored)) == [tuple(c) for c in stored]


@pytest.mark.parametrize("stored, message", [
    ([["epoch", "gt", 5]], "not a \\[column, op, value\\] condition"),
    ([["epoch", "eq", [5]]], "not a \\[column, op, value\\] condition"),
    ([["epoch", "range", [1]]], "not a \\[column, op, value\\] condition"),
    ([["epoch", "eq", 5], ["epoch", "eq", 6]], "given twice"),
    ([["epoch", "eq", "5"]], "is not an integer"),
    ([["nope", "null", None]], "unknown column 'nope'"),
    (["epoch=5"], "not a \\[column, op, value\\] condition"),
])
def test_a_stored_selection_that_is_not_one_is_a_clear_error(stored: list, message: str) -> None:
    from small_transformer_zoo.format.selection import where_of

    with pytest.raises(ValueError, match=message):
        where_of(stored)


@pytest.mark.parametrize("where", [{"optimizer": "adamw"}, {"optimizer": ["adam", "Adam"]}, {"split": "tset"}])
def test_a_value_outside_a_known_set_is_an_error(synthetic_root: Path, where: dict) -> None:
    """`optimizer` and `split` hold one of a known set: any other value would silently select nothing."""
    zoo = Zoo.open(synthetic_root, "syn")
    with pytest.raises(ValueError, match=r"unknown value .*holds one of \["):
        zoo.select("train", where=where)
    with pytest.raises(ValueError, match=r"unknown value .*holds one of \["):
        load_dataset(str(synthetic_root), "syn", split="train", where=where)


def test_stz_bench_where_with_an_unknown_optimizer_is_one_line(synthetic_root: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from small_transformer_zoo.cli import main

    code = main(["bench", str(synthetic_root), "--config", "syn", "--models", "statnn", "--where", "optimizer=adamw"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "'adamw'" in err and "sgd_momentum" in err


@settings(max_examples=30, deadline=None)
@given(low=st.floats(0, 1), high=st.floats(0, 1))
def test_a_reversed_range_names_itself(low: float, high: float) -> None:
    from small_transformer_zoo.format.selection import normalise_where

    if low > high:
        with pytest.raises(ValueError, match=r"where\['dropout'\]: the range .* is reversed"):
            normalise_where({"dropout": (low, high)})
    else:
        assert normalise_where({"dropout": (low, high)}) == [("dropout", "range", [low, high])]
