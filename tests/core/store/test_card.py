"""The dataset card: valid YAML front matter with configs for every config and split, real counts in the body."""

from pathlib import Path

import yaml

from small_transformer_zoo import Zoo
from small_transformer_zoo.cli import main
from small_transformer_zoo.store.card import GENERATED_MARK, render_card
from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo
from tests.helpers import HANG_TIMEOUT, metadata_file


def _front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("\n---\n", 1)[0][4:])


def test_card_lists_every_config_and_split_with_real_counts(tmp_path: Path) -> None:
    write_synthetic_zoo(tmp_path, "alpha", runs=10, register=False)
    write_synthetic_zoo(tmp_path, "beta", runs=30, seed=3, register=False)
    card = (tmp_path / "README.md").read_text()
    meta = _front_matter(card)
    assert [c["config_name"] for c in meta["configs"]] == ["alpha", "beta"]
    assert meta["configs"][1]["data_files"][2] == {
        "split": "test", "path": str(metadata_file(tmp_path / "beta", "test").relative_to(tmp_path))}
    assert meta["size_categories"] == ["n<1K"] and meta["license"] == "mit"
    zoo = Zoo.open(tmp_path, "beta")
    beta = zoo.manifest["counts"]
    distinct = sum(1 for s in zoo.splits for copy in zoo.metadata(s).column("duplicate_of").to_pylist() if copy is None)
    assert 0 < distinct <= beta["checkpoints"]
    assert f"| `beta` | synthetic | 18,506 | 30 | per-run | by run | {beta['checkpoints']:,} | {distinct:,} | " \
           f"{beta['train']:,} / {beta['validation']:,} / {beta['test']:,} |" in card
    assert GENERATED_MARK in card and "{{" not in card


def test_stz_card_rewrites_but_never_clobbers_a_users_readme(tmp_path: Path) -> None:
    write_synthetic_zoo(tmp_path, "alpha", runs=4, register=False)
    assert main(["card", str(tmp_path)]) == 0
    assert (tmp_path / "README.md").read_text() == render_card(tmp_path)
    (tmp_path / "README.md").write_text("# my own notes\n")
    write_synthetic_zoo(tmp_path, "beta", runs=4, register=False)
    assert (tmp_path / "README.md").read_text() == "# my own notes\n"


def test_the_cards_recipe_reads_one_checkpoint_by_range_requests(hub, zoo_copy: Path) -> None:
    """The card's recipe, run exactly as the pushed card prints it (its repo and config filled in) in a fresh
    interpreter that has no package of ours imported, gives the zoo's own first checkpoint, and fetches of its
    shard only a few ranges, never the whole file."""
    import re
    import subprocess
    import sys

    from small_transformer_zoo.hub.push import push_zoo

    push_zoo(zoo_copy, "card/recipe")
    card = (zoo_copy / "README.md").read_text()
    recipe = re.search(r"<!-- recipe -->\n```python\n(.*?)```\n<!-- /recipe -->", card, re.S).group(1)
    assert 'repo, config = "card/recipe", "syn"' in recipe
    assert len([line for line in recipe.splitlines() if line.strip()]) <= 14
    check = ("\nimport sys\nassert not any(m.split('.')[0] in ('small_transformer_zoo', 'builders', 'nfn_baselines')"
             " for m in sys.modules)\nnp.save(sys.argv[1], np.concatenate([v.ravel() for v in state_dict.values()]))")
    out = Path(zoo_copy).parent / "row.npy"
    hub.requests.clear()
    done = subprocess.run([sys.executable, "-c", recipe + check, str(out)], capture_output=True, text=True, timeout=HANG_TIMEOUT)
    assert done.returncode == 0, done.stderr
    import numpy as np

    zoo = Zoo.open(zoo_copy, "syn")
    first_shard = zoo.manifest["shards"][0]
    expected = zoo.split_weights(first_shard["split"]).shards[0][0].numpy()
    np.testing.assert_array_equal(np.load(out), expected)
    shard_reads = [r for m, p, r in hub.requests if m == "GET" and p.endswith(first_shard["path"])]
    assert shard_reads and all(r and r.startswith("bytes=") for r in shard_reads), shard_reads
    fetched = sum(int(b) - int(a) + 1 for r in shard_reads for a, b in [r[6:].split("-")])
    assert fetched < first_shard["bytes"] / 2, (fetched, first_shard["bytes"])


def test_the_card_carries_its_citation_and_whole_zoo_statistics(tmp_path: Path) -> None:
    from huggingface_hub import DatasetCard

    write_synthetic_zoo(tmp_path, "alpha", runs=30, register=False)
    card = DatasetCard.load(tmp_path / "README.md")
    assert "tran2025equivariant" in card.data.to_dict()["citation"]
    zoo = Zoo.open(tmp_path, "alpha")
    values = [v for s in zoo.splits for v in zoo.metadata(s).column("test_accuracy").to_pylist()]
    import numpy as np

    whole = f"{min(values):.3f} / {np.median(values):.3f} / {max(values):.3f}"
    assert f"| {whole} |" in card.text
    test = zoo.metadata("test").column("test_accuracy").to_pylist()
    assert "| `alpha` | test | " in card.text and f"{np.median(test):.3f}" in card.text


def test_the_cards_fields_table_describes_every_parquet_column(zoo_copy: Path) -> None:
    import pyarrow.parquet as pq

    card = render_card(zoo_copy)
    schema = pq.read_schema(metadata_file(zoo_copy / "syn", "train"))
    for field in schema:
        description = field.metadata[b"description"].decode()
        assert f"| `{field.name}` | {field.type} | {description} |" in card
