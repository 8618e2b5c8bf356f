"""AG News: news titles and descriptions, 4 classes, through a frozen 32-d word embedding."""

from __future__ import annotations

from small_transformer_zoo.format.architecture import ArchitectureSpec, text_spec

from ..data import TaskData
from . import DataRequest, Task, register_task


def load(request: DataRequest) -> TaskData:
    from ..text import load_ag_news

    return load_ag_news(request.data_dir, max_train=request.max_train_samples,
                        word2vec=request.options.get("word2vec"), carve_from_test=request.carve_from_test)


def spec(data: TaskData) -> ArchitectureSpec:
    return text_spec(vocab_size=data.embedding.shape[0], max_length=data.train_x.shape[1], num_classes=data.num_classes)


TASK = register_task(Task(
    name="agnews",
    description="AG News articles (title and description, 4 classes: world, sports, business, science/tech), "
                "tokenised to 48 ids over a 5,000-word vocabulary; the 32-d word embedding is frozen and stored once "
                "per zoo (built from the training corpus, or from a word2vec file with --word2vec).",
    load=load, spec=spec, options=("word2vec",),
    data_help="a folder with the standard train.csv and test.csv, or hf://datasets/fancyzhx/ag_news"))
