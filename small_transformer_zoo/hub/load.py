"""`load_dataset`: a zoo as a `datasets` object, from a local root, a Hub repo id, or the short name
`small-transformer-zoo` (`hub.opening.open_zoo` opens one as a `Zoo` instead).

The short name means: a zoo built on this machine under that config (found offline through the local registry),
otherwise the default Hub repo (`$STZ_REPO_ID` overrides it). From the Hub, only the files of the asked config
and split are downloaded, and a second call works offline from the Hugging Face cache.
"""

from __future__ import annotations

import errno
import functools
import itertools
import os
import re
import shutil
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa

from ..errors import ZooDamagedError, ZooFormatError, ZooNotFoundError
from ..format.architecture import ArchitectureSpec
from ..format.selection import Selection
from ..format.splits import SPLIT_NAMES
from ..store.reader import Verify
from ..store.verification import check_verify_mode
from .cached import CacheDamagedError, cache_files, check_cache
from .download import download_zoo, evicting_damaged, streaming_root
from .hf_builder import builder_for, zoo_features
from .locate import ZooLocation, resolve_zoo


def _no_rows() -> Iterator[dict[str, Any]]:
    yield from ()


def _prepare(builder: Any, location: ZooLocation, root: Path) -> None:
    """`download_and_prepare`, its errors naming the file; a Hub download that fails its check leaves the cache,
    with every other damaged file of the config."""
    with evicting_damaged(root if location.kind == "hub" else None, location.config, "load"):
        try:
            builder.download_and_prepare()
        except datasets.exceptions.DatasetGenerationError as exc:
            if isinstance(exc.__cause__, ZooFormatError):  # say which file failed, not that generation did
                raise exc.__cause__ from None
            if (full := _no_space(exc)) is not None:
                raise OSError(errno.ENOSPC, f"no space left on the device of the datasets cache "
                                            f"({builder.cache_dir}) while preparing the zoo: free space, or give "
                                            f"load_dataset a cache_dir on another disk", full.filename) from None
            raise


def load_dataset(
    name_or_path: str | os.PathLike[str],
    config: str | None = None,
    split: str | None = None,
    streaming: bool = False,
    revision: str | None = None,
    *,
    cache_dir: str | None = None,
    token: Any = None,
    verify: Verify = "once",
    where: Mapping[str, Any] | None = None,
    min_accuracy: float | None = None,
    max_accuracy: float | None = None,
    epochs: Iterable[int] | None = None,
    best_only: bool = False,
    include_diverged: bool = False,
    distinct: bool = True,
) -> datasets.Dataset | datasets.DatasetDict | datasets.IterableDataset | datasets.IterableDatasetDict:
    """Load a zoo config as a `datasets` object: one row per checkpoint, packed weights in `params`.

    `name_or_path`: a local zoo root (or config folder), a Hub repo id, or `"small-transformer-zoo"`.
    `split=None` gives all splits as a DatasetDict; a split may be sliced as `datasets` slices splits
    (`"train[:10]"`, `"train[:50%]"`, `"train+validation"`), except when streaming. `streaming=True` reads rows
    lazily (local or Hub).
    `verify`: checks of weight shards and rows before use ("once" per file per machine, "always", "never");
    the `datasets` cache is checked against the zoo's files ("once": each version of its file, `hub.cached`).
    `where`, `min_accuracy`, `max_accuracy`, `epochs`, `best_only`, `include_diverged`, `distinct`: which
    checkpoints, with the same rule and defaults as `Zoo.select` (`small_transformer_zoo.format.selection`): diverged
    checkpoints and repeated weights are left out unless asked for. The filter runs before any weight is read.
    In the rows, a value the zoo does not know is NaN (numbers), -1 (integers) or "" (text), so torch's default
    collate takes them.
    """
    check_verify_mode(verify)
    selection = Selection.of(where, min_accuracy=min_accuracy, max_accuracy=max_accuracy, epochs=epochs,
                             best_only=best_only, include_diverged=include_diverged, distinct=distinct)
    splits = _split_names(split, streaming)
    location = resolve_zoo(name_or_path, config, revision)
    if location.kind == "hub":
        with location.hinting():
            root = streaming_root(location, token) if streaming else str(download_zoo(location, splits, token))
    else:
        root = str(Path(location.root).resolve())  # `datasets` reads relative paths against the root again
    new_builder = functools.partial(builder_for, root, location.config, splits=splits, verify=verify,
                                    cache_dir=cache_dir, token=token, selection=selection)
    builder = new_builder()
    if verify != "never":
        builder.check_across_splits()
    manifest, wanted = builder.manifest, builder.wanted_splits
    filled = tuple(s for s in wanted if manifest["counts"][s] > 0)
    out: dict[str, Any] = {}
    if streaming:
        out = {name: data for name, data in builder.as_streaming_dataset().items() if name in filled}
    elif filled:
        out = _prepared(builder, new_builder, location, Path(root), filled, verify)
    # `datasets` cannot read a split without rows back; an empty split (or selection) is still a split of the zoo.
    features = zoo_features(ArchitectureSpec.from_dict(manifest["architecture"]))
    for name in wanted:
        if name not in out:
            if streaming:
                out[name] = datasets.IterableDataset.from_generator(_no_rows, features=features)
            else:
                out[name] = datasets.Dataset.from_dict({k: [] for k in features}, features=features, split=name)
    if split is None:
        ordered = {name: out[name] for name in wanted}
        return datasets.IterableDatasetDict(ordered) if streaming else datasets.DatasetDict(ordered)
    if split in out:
        return out[split]
    return datasets.concatenate_datasets([out[name] for name in splits]).select(
        _sliced_indices(split, {name: len(out[name]) for name in splits}))


CACHE_READ_ERRORS = (OSError, pa.ArrowInvalid, ValueError)  # a damaged, cut or missing cache file or description


def _prepared(builder: Any, new_builder: Callable[[], Any], location: ZooLocation, root: Path,
              filled: tuple[str, ...], verify: str) -> dict[str, Any]:
    """Every filled split, prepared in the `datasets` cache and checked (`hub.cached`). A cache that cannot be read
    (an Arrow file cut, emptied, deleted or replaced; a description that lies) is derived data: it is evicted and
    prepared again from the zoo once; if that fails too, the error names the cache folder. A full disk is said as
    such."""
    for attempt in range(2):
        before = cache_files(builder.cache_dir)
        try:
            _prepare(builder, location, root)
            created = set(cache_files(builder.cache_dir)) - set(before)
            prepared = builder.info.splits
            out = {name: builder.as_dataset(split=name) for name in filled if prepared[name].num_examples > 0}
            for name, data in out.items():
                check_cache(data, builder, name, verify, created)
            return out
        except ZooFormatError as exc:
            if not isinstance(exc, CacheDamagedError) or attempt:
                raise
            reason = exc.problem.split(";")[0]
        except CACHE_READ_ERRORS as exc:
            if _no_space(exc) is not None:
                raise
            if attempt:
                raise ZooDamagedError(builder.cache_dir, f"the datasets cache cannot be read even after it was "
                                                         f"prepared again ({type(exc).__name__}: "
                                                         f"{' '.join(str(exc).split())[:200]}); delete the folder "
                                                         f"and check the disk") from None
            reason = f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}"
        warnings.warn(f"{builder.cache_dir}: the datasets cache could not be used ({reason}); it is derived data, "
                      f"so it was deleted and prepared again from the zoo", stacklevel=3)
        shutil.rmtree(builder.cache_dir, ignore_errors=True)
        builder = new_builder()
    raise AssertionError("unreachable")


def _no_space(exc: BaseException) -> OSError | None:
    """The ENOSPC error somewhere in an exception's chain, if there is one."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _split_names(split: str | None, streaming: bool) -> tuple[str, ...] | None:
    """The zoo splits a `split` argument reads: a split name, or `datasets`' slicing syntax over them."""
    if split is None:
        return None
    if split in SPLIT_NAMES:
        return (split,)
    names = tuple(dict.fromkeys(re.findall(r"(?:^|\+)\s*(\w+)", split)))
    unknown = [n for n in names if n not in SPLIT_NAMES]
    if not names or unknown:
        raise ZooNotFoundError(None, f"unknown split {split!r}; zoo splits are {list(SPLIT_NAMES)}, sliced as "
                                   f"'train[:10]', 'train[:50%]' or 'train+validation'")
    if streaming:
        raise ValueError(f"split {split!r}: a stream cannot be sliced; stream a split and use .take(n) or "
                         f".skip(n), or load it without streaming")
    return names


def _sliced_indices(split: str, lengths: dict[str, int]) -> list[int]:
    """Row indices into the concatenation of `lengths`' splits that the slicing syntax `split` selects."""
    try:
        instruction = datasets.ReadInstruction.from_spec(split)
        absolute = instruction.to_absolute(dict(lengths))
    except (ValueError, AssertionError, KeyError) as exc:
        raise ValueError(f"split {split!r}: {exc}") from None
    offsets = dict(zip(lengths, [0, *itertools.accumulate(lengths.values())][:-1]))
    return [offsets[part.splitname] + i for part in absolute for i in range(part.from_, part.to)]
