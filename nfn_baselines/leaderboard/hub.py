"""A leaderboard that lives on the Hub (docs/design.md section 10).

A leaderboard is a Hub dataset repo holding `results.json` (the format of `leaderboard.py`) and the accepted
submissions under `submissions/<config>/<split>/` (and a folder per target and selection beyond the default). A
participant's `stz submit` checks a submission against the public zoo (every id once, scores where the zoo holds
the labels) and opens a pull request that adds the file and a claim (`<name>.json`: who, which zoo split and
selection, the file's sha256, the scores seen locally). A maintainer's `stz review` re-scores the pull request's
file against the full zoo, the one with the held-out labels, and only then adds the entry to `results.json` in
the pull request and merges it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from small_transformer_zoo import Zoo
from small_transformer_zoo.hub.opening import open_zoo
from small_transformer_zoo.errors import DataError, hub_errors
from small_transformer_zoo.format.manifest import package_version
from small_transformer_zoo.format.selection import normalise_where, where_of

from .scoring import (SubmissionError, check_submission, parse_leaderboard, results_bytes, score_submission,
                      score_values, selection_text, with_result)
from ..models.metrics import DEFAULT_THRESHOLDS, defined
from ..bench.protocols import PROTOCOLS, protocol_where
from ..models.targets import get_target

RESULTS = "results.json"
WITHHELD_SPLITS = ("test",)  # the splits a leaderboard scores by default: those its public zoo withholds
SUBMISSIONS = "submissions"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._ -]{0,63}")
DIFF_HEADER = "diff --git "
CLAIM_KEYS = ("format", "name", "config", "split", "file", "sha256", "metrics")


@dataclass
class Submitted:
    """An opened pull request: its number and address, and the scores seen locally (None: labels withheld)."""

    pr_num: int
    pr_url: str
    metrics: dict[str, Any] | None


@dataclass
class Review:
    """A maintainer's re-scoring of one pull request."""

    pr_num: int
    claim: dict[str, Any]
    metrics: dict[str, Any]
    merged: bool


def _hub_call(what: str, call: Any, *args: Any, passthrough: type[Exception] | tuple[()] = (),
              **kwargs: Any) -> Any:
    """Run a Hub call inside `hub_errors(what)`."""
    with hub_errors(what, passthrough=passthrough):
        return call(*args, **kwargs)


def submission_path(config: str, split: str, name: str, suffix: str, target: str = "test_accuracy",
                    selection: Sequence[Any] = ()) -> str:
    """Where an accepted submission lives in the leaderboard repo: under its target's folder (except for the
    default target, test accuracy) and its selection's (`normalise_where`'s conditions; none for every
    checkpoint), named after the selection and a digest of it, so that two selections never share a file."""
    if not NAME.fullmatch(name):
        raise SubmissionError(f"name {name!r}: 1-64 letters, digits, spaces, '.', '_' or '-', starting with a "
                              f"letter or digit")
    folder = f"{SUBMISSIONS}/{config}/{split}" + ("" if target == "test_accuracy" else f"/{get_target(target).name}")
    if selection:
        digest = hashlib.sha256(json.dumps([list(c) for c in selection]).encode()).hexdigest()[:8]
        folder += f"/{_slug(selection_text(list(selection)))[:64]}-{digest}"
    return f"{folder}/{_slug(name)}{suffix}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text)


def submit(path: str | os.PathLike[str], repo_id: str, zoo: Zoo | str | os.PathLike[str], config: str | None,
           split: str, name: str, thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS,
           token: Any = None, target: str = "test_accuracy", *, protocol: str = "all-checkpoints",
           epoch: int | None = None, where: Mapping[str, Any] | None = None) -> Submitted:
    """Check a submission against the checkpoints of the (public) zoo that the protocol and `where` select (as
    `score_submission` does), then open a pull request adding it and its claim (which records the selection)."""
    from huggingface_hub import CommitOperationAdd, HfApi

    path = Path(path)
    zoo = open_zoo(zoo, config)
    config = zoo.config
    selection, epoch = protocol_where(zoo, protocol, epoch, where)
    suffix = ".parquet" if path.suffix.lower() == ".parquet" else ".csv"
    destination = submission_path(config, split, name, suffix, target, normalise_where(selection))
    _, predicted, truth = check_submission(path, zoo, split, target, selection)
    metrics = None if truth is None else defined(score_values(predicted, truth, target, thresholds))
    raw = path.read_bytes()
    claim = {"format": "stz-submission", "version": 1, "name": name, "config": config, "split": split,
             "target": target, "protocol": protocol, "epoch": epoch,
             "where": [list(c) for c in normalise_where(where)], "file": destination,
             "sha256": hashlib.sha256(raw).hexdigest(), "metrics": metrics,
             "submitted_with": f"small-transformer-zoo {package_version()}"}
    operations = [CommitOperationAdd(destination, raw),
                  CommitOperationAdd(destination.rsplit(".", 1)[0] + ".json", json.dumps(claim, indent=2).encode())]
    info = _hub_call(f"opening a pull request on dataset {repo_id}", HfApi(token=token).create_commit,
                     repo_id, operations, repo_type="dataset", create_pr=True,
                     commit_message=f"Submission {name} for {config}/{split}")
    return Submitted(info.pr_num, info.pr_url, metrics)


def create_leaderboard(repo_id: str, private: bool = False, token: Any = None) -> str:
    """Create a leaderboard's Hub dataset repo with an empty results file (an existing repo is refused: its results
    are never overwritten); returns its address."""
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi(token=token)
    url = _hub_call(f"creating dataset {repo_id}", api.create_repo, repo_id, repo_type="dataset", private=private)
    _hub_call(f"writing {RESULTS} to dataset {repo_id}", api.create_commit, repo_id,
              [CommitOperationAdd(RESULTS, results_bytes([]))], repo_type="dataset",
              commit_message="An empty leaderboard")
    return str(url)


def hub_results(repo_id: str, revision: str | None = None, token: Any = None) -> list[dict[str, Any]]:
    """The entries of the leaderboard repo's results file (none yet: an empty list)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import RemoteEntryNotFoundError

    try:
        local = _hub_call(f"reading {RESULTS} of dataset {repo_id}", hf_hub_download, repo_id, RESULTS,
                          repo_type="dataset", revision=revision, token=token, passthrough=RemoteEntryNotFoundError)
    except RemoteEntryNotFoundError:  # the Hub answered: the repo has no results yet
        return []
    return parse_leaderboard(Path(local).read_bytes(), f"{repo_id}/{RESULTS}")


def open_pull_requests(repo_id: str, token: Any = None) -> list[int]:
    """Numbers of the leaderboard repo's open pull requests, oldest first."""
    from huggingface_hub import HfApi

    def listing() -> list[Any]:
        return list(HfApi(token=token).get_repo_discussions(repo_id, repo_type="dataset",
                                                            discussion_type="pull_request",
                                                            discussion_status="open"))

    return sorted(d.num for d in _hub_call(f"listing pull requests of dataset {repo_id}", listing))


def review(repo_id: str, pr_num: int, zoo: Zoo | str | os.PathLike[str], *, merge: bool = False,
           thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS, token: Any = None,
           splits: tuple[str, ...] = WITHHELD_SPLITS) -> Review:
    """Re-score pull request `pr_num` against the full zoo `zoo` (a Zoo or a root); with `merge`, add the entry to
    the results file inside the pull request and merge it. A pull request that changes anything but one
    submission and its claim, whose file does not match its claim, or that is for a split the leaderboard does not
    withhold (`splits`: its labels are public, so anyone could score 1.0) is refused. Everything is read at one
    commit of the pull request, the one scored, and the review is recorded on top of exactly that commit (a
    `.review.json` beside the claim): a file swapped after scoring is never merged under the old score. The entry
    then joins the results file on main by a conditional commit (`add_hub_result`), so concurrent reviews lose no
    entry, and the pull request is merged. Nothing is written until every check passed."""
    from huggingface_hub import CommitOperationAdd, HfApi, hf_hub_download

    api = HfApi(token=token)
    where = f"dataset {repo_id} pull request #{pr_num}"
    details = _hub_call(f"reading {where}", api.get_discussion_details, repo_id, pr_num, repo_type="dataset")
    if not details.is_pull_request or details.status != "open":
        raise DataError(f"{where}: not an open pull request (status {details.status})")
    scored = _hub_call(f"reading {where}", api.dataset_info, repo_id, revision=f"refs/pr/{pr_num}").sha
    changed = _changed_files(details.diff, where)
    claims = [f for f in changed if f.endswith(".json")]
    if len(changed) != 2 or len(claims) != 1 or not all(f.startswith(f"{SUBMISSIONS}/") for f in changed):
        raise SubmissionError(f"{where}: must add one submission and its claim under {SUBMISSIONS}/, changes "
                              f"{changed}")
    claim_file = _hub_call(f"reading {where}", hf_hub_download, repo_id, claims[0], repo_type="dataset",
                           revision=scored, token=token)
    claim = _check_claim(Path(claim_file).read_bytes(), changed, f"{where}: {claims[0]}")
    if claim["split"] not in splits:
        raise SubmissionError(f"{where}: a submission for split {claim['split']!r}, which this leaderboard does not "
                              f"withhold (it scores {list(splits)}): its labels are public")
    local = _hub_call(f"reading {where}", hf_hub_download, repo_id, claim["file"], repo_type="dataset",
                      revision=scored, token=token)
    digest = hashlib.sha256(Path(local).read_bytes()).hexdigest()
    if digest != claim["sha256"]:
        raise SubmissionError(f"{where}: {claim['file']} has sha256 {digest}, its claim says {claim['sha256']}")
    protocol, epoch, chosen, _ = claim_selection(claim, where)
    metrics = defined(score_submission(local, zoo, claim["config"], claim["split"], thresholds, claim_target(claim),
                                       protocol=protocol, epoch=epoch, where=chosen))
    if merge:
        comment = f"Scored against the held-out labels: {main_metric_text(metrics)}"
        review_file = claims[0].removesuffix(".json") + ".review.json"
        record = json.dumps({"pull_request": pr_num, "scored_commit": scored, "metrics": metrics}, indent=2)
        _hub_call(f"recording the review in {where} (it changed after it was scored: review it again)",
                  api.create_commit, repo_id, [CommitOperationAdd(review_file, record.encode())],
                  repo_type="dataset", revision=f"refs/pr/{pr_num}", parent_commit=scored,
                  commit_message=f"Scored {claim['name']} against the held-out labels")
        add_hub_result(api, repo_id, claim["name"], claim["config"], claim["split"], metrics,
                       f"pull request #{pr_num}: {claim['file']}", token)
        _hub_call(f"merging {where}", api.merge_pull_request, repo_id, pr_num, repo_type="dataset", comment=comment)
    return Review(pr_num, claim, metrics, merge)


RESULTS_ATTEMPTS = 8


def add_hub_result(api: Any, repo_id: str, name: str, config: str, split: str, metrics: dict[str, Any], source: str,
                   token: Any = None) -> None:
    """Add one entry to the leaderboard repo's results file on main: read at main's head, changed, and committed
    with that head as the parent commit, which the Hub refuses if main moved meanwhile (a review merged from
    elsewhere); then read again and tried again. No concurrent writer's entry is lost."""
    from huggingface_hub import CommitOperationAdd
    from huggingface_hub.errors import HfHubHTTPError

    for _ in range(RESULTS_ATTEMPTS):
        head = _hub_call(f"reading dataset {repo_id}", api.dataset_info, repo_id, revision="main").sha
        entries = with_result(hub_results(repo_id, head, token), name, config, split, metrics, source)
        try:
            with hub_errors(f"adding {name!r} to {repo_id}/{RESULTS}", passthrough=HfHubHTTPError):
                api.create_commit(repo_id, [CommitOperationAdd(RESULTS, results_bytes(entries))],
                                  repo_type="dataset", revision="main", parent_commit=head,
                                  commit_message=f"Score {name} against the held-out labels")
            return
        except HfHubHTTPError as exc:
            if exc.response is None or exc.response.status_code not in (409, 412):
                raise
    raise DataError(f"dataset {repo_id}: {RESULTS} kept changing while {name!r} was added ({RESULTS_ATTEMPTS} "
                    f"tries); review again")


def _changed_files(diff: str | None, where: str) -> list[str]:
    """The paths a pull request changes, from the Hub's diff of it against the branch it targets (`diff --git
    a/P b/P` headers, read exactly: a path may hold spaces, even at its end; a rename, or a header that is not of
    that form, is refused). A file added to main after the pull request was opened is not its change."""
    paths = set()
    for line in (diff or "").split("\n"):
        if not line.startswith(DIFF_HEADER):
            continue
        rest = line[len(DIFF_HEADER):]
        half = (len(rest) - 5) // 2  # "a/" + P + " b/" + P
        path = rest[2 : 2 + half]
        if half < 1 or rest != f"a/{path} b/{path}":
            raise SubmissionError(f"{where}: a change the review cannot read exactly ({line!r}); a submission only "
                                  f"adds its two files")
        paths.add(path)
    if not paths:
        raise SubmissionError(f"{where}: the Hub reports no changed files for it; nothing to review")
    return sorted(paths)


def claim_target(claim: dict[str, Any]) -> str:
    """A claim's target (claims made before there were other targets are for test accuracy)."""
    return str(claim.get("target") or "test_accuracy")


def claim_selection(claim: dict[str, Any], where: str) -> tuple[str, int | None, dict[str, Any], dict[str, Any]]:
    """A claim's protocol, epoch, `where` and the selection they make (`protocol_where`; claims made before there
    were selections are for every checkpoint), checked: anything else is a SubmissionError naming `where`."""
    protocol, epoch = claim.get("protocol") or "all-checkpoints", claim.get("epoch")
    if protocol not in PROTOCOLS:
        raise SubmissionError(f"{where}: protocol {protocol!r} is not one of {list(PROTOCOLS)}")
    if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1):
        raise SubmissionError(f"{where}: epoch {epoch!r} is not a positive whole number")
    if (protocol == "paper") != (epoch is not None):
        raise SubmissionError(f"{where}: protocol {protocol!r} with epoch {epoch!r}: the paper protocol, and only "
                              f"it, names its epoch")
    try:
        chosen = where_of(claim.get("where") or [])
        selection, _ = protocol_where(None, protocol, epoch, chosen)
    except (TypeError, ValueError) as exc:
        raise SubmissionError(f"{where}: its selection cannot be read ({exc})") from None
    return protocol, epoch, chosen, selection


def main_metric_text(metrics: dict[str, Any]) -> str:
    """The main metric of scores as text ("undefined" where it is null, as for constant predictions)."""
    name = "accuracy" if "accuracy" in metrics else "tau"
    value = metrics.get(name)
    return f"{name} {value:.4f}" if isinstance(value, (int, float)) else f"{name} undefined"


def _check_claim(raw: bytes, changed: list[str], where: str) -> dict[str, Any]:
    try:
        claim = json.loads(raw)
    except ValueError as exc:
        raise SubmissionError(f"{where}: not JSON ({exc})") from None
    if not isinstance(claim, dict) or any(k not in claim for k in CLAIM_KEYS) or claim["format"] != "stz-submission":
        raise SubmissionError(f"{where}: not a submission claim (needs {list(CLAIM_KEYS)})")
    selection = claim_selection(claim, where)[3]
    expected = submission_path(str(claim["config"]), str(claim["split"]), str(claim["name"]),
                               Path(str(claim["file"])).suffix, claim_target(claim), normalise_where(selection))
    if claim["file"] != expected or expected not in changed:
        raise SubmissionError(f"{where}: names file {claim['file']!r}, expected {expected!r} in the pull request")
    return claim
