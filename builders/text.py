"""AG News for the text zoo: tokens, a vocabulary and a frozen 32-d word embedding built from the training corpus.

The embedding is a truncated SVD (scikit-learn, fixed random_state) of the positive pointwise mutual information
of word co-occurrences in a +-4 word window: deterministic, built in seconds, and standard. Row 0 is padding and
unknown words (zeros). A user's pretrained word2vec text file can replace it (reduced to 32 dims by PCA).
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from pathlib import Path

import numpy as np
from scipy import sparse

from small_transformer_zoo.errors import ZooArgumentError, ZooDamagedError

from .data import (CARVED, HUB_PREFIX, TaskData, carve_test, hub_repo, labels_ok, load_hub_split_columns, read_ag_news_csv,
                   split_validation)

TOKEN = re.compile(r"[a-z0-9']+")
EMBED_DIM = 32
WINDOW = 4


def tokenize(text: str) -> list[str]:
    return TOKEN.findall(text.lower().replace("\\", " "))


def build_vocabulary(texts: list[list[str]], size: int) -> dict[str, int]:
    """The `size - 1` most frequent words (ties broken alphabetically) get ids 1..; 0 is padding / unknown."""
    counts = Counter(word for tokens in texts for word in tokens)
    words = sorted(counts, key=lambda w: (-counts[w], w))[: size - 1]
    return {word: index for index, word in enumerate(words, start=1)}


def encode(texts: list[list[str]], vocabulary: dict[str, int], length: int) -> np.ndarray:
    out = np.zeros((len(texts), length), dtype=np.int64)
    for row, tokens in enumerate(texts):
        ids = [vocabulary.get(word, 0) for word in tokens][:length]
        out[row, : len(ids)] = ids
    return out


def ppmi_svd_embedding(ids: np.ndarray, vocab_size: int, dim: int = EMBED_DIM) -> np.ndarray:
    """[vocab_size, dim] float32 embedding from the encoded training texts (row 0 zero, rows unit length)."""
    from sklearn.decomposition import TruncatedSVD

    rows, cols = [], []
    for offset in range(1, WINDOW + 1):
        left, right = ids[:, :-offset].reshape(-1), ids[:, offset:].reshape(-1)
        keep = (left > 0) & (right > 0)
        rows += [left[keep], right[keep]]
        cols += [right[keep], left[keep]]
    r, c = np.concatenate(rows), np.concatenate(cols)
    counts = sparse.coo_matrix((np.ones(len(r)), (r, c)), shape=(vocab_size, vocab_size)).tocsr()
    total = counts.sum()
    row_sum = np.asarray(counts.sum(1)).ravel()
    col_sum = np.asarray(counts.sum(0)).ravel()
    coo = counts.tocoo()
    pmi = np.log(coo.data * total / (row_sum[coo.row] * col_sum[coo.col]))
    keep = pmi > 0
    ppmi = sparse.csr_matrix((pmi[keep], (coo.row[keep], coo.col[keep])), shape=counts.shape)
    vectors = TruncatedSVD(n_components=dim, random_state=0, algorithm="arpack").fit_transform(ppmi)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    vectors = np.where(norms > 0, vectors / np.maximum(norms, 1e-12), 0.0)
    vectors[0] = 0.0
    return vectors.astype(np.float32)


def load_word2vec_text(path: Path, vocabulary: dict[str, int], dim: int = EMBED_DIM) -> np.ndarray:
    """A pretrained word2vec text file (`word v1 v2 ...` per line) reduced to `dim` by PCA, rows by vocabulary id."""
    from sklearn.decomposition import PCA

    vectors: dict[str, np.ndarray] = {}
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line_number, line in enumerate(handle, start=1):
            parts = line.rstrip().split(" ")
            if line_number == 1 and len(parts) == 2:
                continue  # the optional "count dim" header
            if parts[0] in vocabulary:
                try:
                    vectors[parts[0]] = np.asarray(parts[1:], dtype=np.float64)
                except ValueError:
                    raise ZooDamagedError(path, f"line {line_number}: not a word followed by numbers") from None
    sizes = {len(v) for v in vectors.values()}
    if len(sizes) > 1:
        raise ZooDamagedError(path, f"vectors of different lengths {sorted(sizes)}")
    if len(vectors) < dim:
        raise ZooDamagedError(path, f"only {len(vectors)} of the vocabulary's words have vectors; need at least {dim}")
    words = sorted(vectors)
    reduced = PCA(n_components=dim, random_state=0).fit_transform(np.stack([vectors[w] for w in words]))
    table = np.zeros((len(vocabulary) + 1, dim), dtype=np.float32)
    for word, row in zip(words, reduced):
        table[vocabulary[word]] = row
    return table


def load_ag_news(data_dir: str | Path | None, max_train: int | None = None, vocab_size: int = 5_000,
                 length: int = 48, word2vec: str | Path | None = None, carve_from_test: bool = False) -> TaskData:
    """AG News from a folder with train.csv and test.csv (a folder with test.csv only is refused unless
    `carve_from_test`), or from the Hub with `hf://datasets/<repo>` (a dataset with `text` and `label` 0..3
    columns, as fancyzhx/ag_news)."""
    if data_dir is None:
        raise ZooArgumentError(None, "AG News needs --data-dir: a folder with the standard train.csv and test.csv, or "
                                   "hf://datasets/fancyzhx/ag_news")
    repo = hub_repo(data_dir)
    if repo is not None:
        splits = load_hub_split_columns(repo, ("text", "label"))
        for split, (_, labels) in splits.items():
            labels_ok(labels, 4, Path(f"{HUB_PREFIX}{repo}/{split}"))
        (train_texts, train_y), (test_texts, test_y) = splits["train"], splits["test"]
        source = {"dataset": "ag_news", "from": f"{HUB_PREFIX}{repo}", "files": "train and test splits"}
    else:
        folder = Path(data_dir)
        test_texts, test_y = read_ag_news_csv(folder / "test.csv")
        if (folder / "train.csv").is_file():
            train_texts, train_y = read_ag_news_csv(folder / "train.csv")
            how = "train.csv and test.csv"
        else:
            train_texts, train_y, test_texts, test_y = carve_test(test_texts, test_y, folder, "train.csv",
                                                                  carve_from_test)
            how = CARVED
        source = {"dataset": "ag_news", "from": str(folder.resolve()), "files": how, "carved_from_test": how == CARVED}
    train_tokens = [tokenize(t) for t in train_texts]
    vocabulary = build_vocabulary(train_tokens, vocab_size)
    train_ids = encode(train_tokens, vocabulary, length)
    if word2vec:
        embedding, embedding_source = load_word2vec_text(Path(word2vec), vocabulary), f"word2vec file {word2vec}"
    else:
        embedding = ppmi_svd_embedding(train_ids, len(vocabulary) + 1)
        embedding_source = "PPMI (window 4) + TruncatedSVD(32, arpack, random_state=0), scikit-learn"
    test_ids = encode([tokenize(t) for t in test_texts], vocabulary, length)
    train_ids, train_y, val_ids, val_y = split_validation(train_ids, train_y)
    if max_train is not None:
        train_ids, train_y = train_ids[:max_train], train_y[:max_train]
    digest = hashlib.sha256(train_ids.tobytes() + test_ids.tobytes() + embedding.tobytes()).hexdigest()
    return TaskData("text", 4, train_ids, train_y, val_ids, val_y, test_ids, test_y,
                    source={**source, "sha256": digest, "vocabulary_size": len(vocabulary) + 1, "max_length": length,
                            "embedding": embedding_source,
                            "embedding_sha256": hashlib.sha256(embedding.tobytes()).hexdigest()},
                    embedding=embedding)
