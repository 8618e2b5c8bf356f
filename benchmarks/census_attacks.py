"""Part 4 of `reliability_census.py`: attacks on writers, the importer and the leaderboard. Each returns
"refused, clear error", "done, no harm", or what went wrong ("harm: ...", "silently wrong: ...")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from common import PROJECT, start_hub

from nfn_baselines.leaderboard.scoring import MAX_BYTES, MAX_ROWS

from nfn_baselines.bench.submission import write_submission
from small_transformer_zoo import Zoo, ZooFormatError, ZooWriter, mnist_spec
from small_transformer_zoo.errors import DataError
from small_transformer_zoo.original import import_original
from small_transformer_zoo.testing.synthetic_release import write_synthetic_release
from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo

REFUSED, DONE = "refused, clear error", "done, no harm"
Attack = Callable[[Path, Path], str]
ATTACKS: dict[str, Attack] = {}


def attack(name: str) -> Callable[[Attack], Attack]:
    def register(fn: Attack) -> Attack:
        ATTACKS[name] = fn
        return fn
    return register


def _refused(call: Callable[[], object], *errors: type[Exception]) -> bool:
    try:
        call()
    except errors or (ValueError,):
        return True
    return False


def _in_subprocess(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                              cwd=PROJECT)
    except subprocess.TimeoutExpired:
        return None


@attack("writer: the config's lock file is a link to a file outside the root")
def lock_link(work: Path, _: Path) -> str:
    precious = work / "precious.txt"
    precious.write_text("keep")
    (work / "root").mkdir()
    (work / "root" / ".syn.lock").symlink_to(precious)
    refused = _refused(lambda: write_synthetic_zoo(work / "root", "syn", runs=4, register=False))
    if precious.read_text() != "keep":
        return "harm: the link's target was written"
    return REFUSED if refused else "harm: written through the link"


@attack("writer: the config's metadata folder is a link to a folder outside")
def metadata_link(work: Path, _: Path) -> str:
    outside = work / "outside"
    outside.mkdir()
    (outside / "train-0.parquet").write_text("someone's file")
    (work / "root" / "syn").mkdir(parents=True)
    (work / "root" / "syn" / "metadata").symlink_to(outside)
    refused = _refused(lambda: ZooWriter(work / "root", "syn", mnist_spec()))
    if not (outside / "train-0.parquet").exists():
        return "harm: a file outside the root was deleted"
    return REFUSED if refused else "harm: the writer wrote through the link"


@attack("writer: the root's README.md is a FIFO (the card refresh)")
def readme_fifo(work: Path, _: Path) -> str:
    (work / "root").mkdir()
    os.mkfifo(work / "root" / "README.md")
    done = _in_subprocess("import sys; from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo; "
                          "write_synthetic_zoo(sys.argv[1], 'syn', runs=4, register=False)", str(work / "root"), timeout=60)
    if done is None:
        return "harm: the writer hangs"
    return DONE if done.returncode == 0 and Zoo.open(work / "root", "syn").verify() == [] else \
        f"other: exit {done.returncode}"


@attack("writer: the root's README.md is a link to /dev/zero")
def readme_zero(work: Path, _: Path) -> str:
    (work / "root").mkdir()
    (work / "root" / "README.md").symlink_to("/dev/zero")
    code = ("import resource, sys; from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo; "
            "write_synthetic_zoo(sys.argv[1], 'syn', runs=4, register=False); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    done = _in_subprocess(code, str(work / "root"), timeout=60)
    if done is None:
        return "harm: the writer hangs"
    if done.returncode != 0:
        return f"other: exit {done.returncode}"
    return DONE if (work / "root" / "README.md").is_symlink() else "harm: the link was replaced"


@attack("merge: over an existing zoo of the same config, without --replace")
def merge_over(work: Path, _: Path) -> str:
    from builders.build import BuildRequest, merge_shards, run_build

    shard = work / "shard"
    run_build(BuildRequest.of("mnist", "tiny", shard, num_shards=1), progress=False, log=lambda *_: None)
    before = (shard / "mnist-tiny" / "zoo.json").read_bytes()
    refused = _refused(lambda: merge_shards(BuildRequest.of("mnist", "tiny", shard), [shard]), ZooFormatError)
    same = (shard / "mnist-tiny" / "zoo.json").read_bytes() == before
    return REFUSED if refused and same else "harm: the zoo was replaced"


def _release(work: Path) -> object:
    return write_synthetic_release(work / "release", runs=3)


def _poison_first_checkpoint(release: object, tensor: torch.Tensor) -> None:
    path = sorted((release.top / "mnist").glob("*.pt"))[0]
    state = torch.load(path, weights_only=True)
    name = next(k for k in state if "pos_embedding" not in k)
    torch.save({**state, name: tensor}, path)


for _kind, _tensor in (("complex64", lambda: torch.zeros(2, dtype=torch.complex64)),
                       ("bfloat16", lambda: torch.zeros(2, dtype=torch.bfloat16)),
                       ("sparse", lambda: torch.zeros(2, 2).to_sparse())):
    def _dtype_attack(work: Path, _: Path, make: Callable[[], torch.Tensor] = _tensor) -> str:
        release = _release(work)
        _poison_first_checkpoint(release, make())
        refused = _refused(lambda: import_original(release.top.parent, work / "out", "c", workers=1), ZooFormatError)
        return REFUSED if refused else "silently wrong: imported"
    attack(f"importer: a checkpoint tensor of dtype or layout {_kind}")(_dtype_attack)


@attack("importer: a zip of a few MB holding a 1 GiB member")
def zip_bomb(work: Path, _: Path) -> str:
    release = _release(work)
    archive = work / "bomb.zip"
    first = sorted((release.top / "mnist").glob("*.pt"))[0]
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(release.top.rglob("*")):
            if path.is_file() and path != first:
                zf.write(path, path.relative_to(release.top.parent).as_posix())
        with zf.open(first.relative_to(release.top.parent).as_posix(), "w", force_zip64=True) as handle:
            for _ in range(1024):
                handle.write(bytes(1 << 20))
    code = ("import resource, sys\nfrom small_transformer_zoo.original import import_original\n"
            "from small_transformer_zoo import ZooFormatError\ntry:\n"
            "    import_original(sys.argv[1], sys.argv[2], 'c', workers=1)\n    print('imported')\n"
            "except ZooFormatError as exc:\n    print('refused', exc)\n"
            "print('peak', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    done = _in_subprocess(code, str(archive), str(work / "out"))
    if done is None or done.returncode != 0:
        return f"other: {done.stderr[-200:] if done else 'timeout'}"
    return REFUSED if "refused" in done.stdout else "harm: the member was read"


@attack("importer: a source file changed after an interrupted import")
def changed_source(work: Path, _: Path) -> str:
    release = _release(work)

    def stop(done: int, total: int) -> None:
        if done >= 5:
            raise KeyboardInterrupt

    try:
        import_original(release.top.parent, work / "out", "c", part_size=5, workers=1, progress=stop)
    except KeyboardInterrupt:
        pass
    path = sorted((release.top / "mnist").glob("*.pt"))[0]
    torch.save({k: v if "pos_embedding" in k else v + 1.0 for k, v in torch.load(path, weights_only=True).items()},
               path)
    resumed = import_original(release.top.parent, work / "out", "c", part_size=5, workers=1)
    fresh = import_original(release.top.parent, work / "fresh", "c", part_size=5, workers=1)
    same = [s["sha256"] for s in resumed.manifest["shards"]] == [s["sha256"] for s in fresh.manifest["shards"]]
    return DONE if same else "silently wrong: the old part was kept"


@attack("importer: killed after its zoo.json was in place, then run again")
def killed_after_manifest(work: Path, _: Path) -> str:
    release = _release(work)
    done = import_original(release.top.parent, work / "out", "c", workers=1)
    folder = work / "out" / "c" / ".import"
    (folder / "parts").mkdir(parents=True)
    (folder / "plan.json").write_text(json.dumps({"release_csv_sha256": done.manifest["provenance"]["release_csv_sha256"],
                                                  "part_size": 1000, "architecture": done.manifest["architecture"]}))
    again = import_original(release.top.parent, work / "out", "c", workers=1)
    return DONE if again.manifest == done.manifest and not folder.exists() else "other: not finished"


def _scorer_peak(path: Path) -> tuple[float, str]:
    code = ("import resource, sys\nfrom nfn_baselines.leaderboard.scoring import SubmissionError, read_submission\n"
            "try:\n    read_submission(sys.argv[1])\n    print('read')\nexcept SubmissionError:\n    print('refused')\n"
            "own = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
            "print('peak', max(own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))")
    done = _in_subprocess(code, str(path), timeout=300)
    if done is None:
        return float("inf"), "timeout"
    return int(done.stdout.split("peak")[-1]) / 1024, done.stdout.split()[0]


def _scorer_attack(make: Callable[[Path], Path]) -> Attack:
    def run(work: Path, _: Path) -> str:
        peak, said = _scorer_peak(make(work))
        if peak > 300:
            return f"harm: {peak:.0f} MiB"
        return f"{REFUSED if said == 'refused' else DONE} ({peak:.0f} MiB peak)"
    return run


def _blank(work: Path) -> Path:
    path = work / "blank.csv"
    with open(path, "w") as handle:
        handle.write("checkpoint_id,predicted_accuracy\n" + "\n" * (MAX_BYTES - 100))
    return path


def _rows(work: Path) -> Path:
    path = work / "rows.csv"
    with open(path, "w") as handle:
        handle.write("checkpoint_id,predicted_accuracy\n")
        handle.writelines(f"r{i:07d}-e012,0.5\n" for i in range(MAX_ROWS + 1))
    return path


def _bomb(work: Path) -> Path:
    path = work / "bomb.parquet"
    table = pa.table({"checkpoint_id": pa.array(["x" * 100_000] * 50_000).dictionary_encode(),
                      "predicted_accuracy": pa.array(np.full(50_000, 0.5))})
    pq.write_table(table, path, compression="zstd")
    return path


attack("scorer: 64 MB of blank lines")(_scorer_attack(_blank))
attack("scorer: one row more than the limit")(_scorer_attack(_rows))
attack("scorer: 1 MB of dictionary-encoded Parquet that decodes to 5 GB")(_scorer_attack(_bomb))


def _leaderboard_case(work: Path, pristine: Path, files: Callable[[Path], dict[str, bytes]], merge: bool = True,
                      splits: tuple[str, ...] = ("test",)) -> str:
    from huggingface_hub import CommitOperationAdd, HfApi

    from nfn_baselines.leaderboard.hub import hub_results, review

    repo = f"census/{work.name}"
    api = HfApi()
    api.create_repo(repo, repo_type="dataset")
    num = api.create_commit(repo, [CommitOperationAdd(k, v) for k, v in files(work).items()], repo_type="dataset",
                            create_pr=True, commit_message="census").pr_num
    try:
        done = review(repo, num, pristine, merge=merge, splits=splits)
    except DataError:
        return REFUSED if not any("results.json" == f for f in api.list_repo_files(repo, repo_type="dataset")) \
            else "harm: results.json was written before the refusal"
    return DONE if done.metrics is not None and hub_results(repo) else "other: no results"


def _submission(work: Path, pristine: Path, split: str = "test", constant: bool = False) -> tuple[Path, bytes]:
    import hashlib

    meta = Zoo.open(pristine, "syn").metadata(split)
    truth = np.asarray(meta.column("test_accuracy").to_pylist())
    path = write_submission(work / f"{split}.csv", meta.column("checkpoint_id").to_pylist(),
                            np.full(len(truth), 0.5) if constant else truth)
    claim = {"format": "stz-submission", "version": 1, "name": "x", "config": "syn", "split": split,
             "file": f"submissions/syn/{split}/x.csv", "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
             "metrics": None}
    return path, json.dumps(claim).encode()


def _pr(extra: str | None = None, split: str = "test", constant: bool = False) -> Callable[[Path, Path], str]:
    def run(work: Path, pristine: Path) -> str:
        def files(_: Path) -> dict[str, bytes]:
            path, claim = _submission(work, pristine, split, constant)
            out = {f"submissions/syn/{split}/x.csv": path.read_bytes(), f"submissions/syn/{split}/x.json": claim}
            return out | ({extra: b"{}"} if extra else {})
        result = _leaderboard_case(work, pristine, files)
        return result
    return run


attack("review: a pull request that also adds 'evil file.txt'")(_pr("submissions/syn/test/evil file.txt"))
attack("review: a pull request that also adds 'results.json ' (a trailing space)")(_pr("results.json "))
attack("review: constant predictions (tau undefined), merged")(_pr(constant=True))
attack("review: a submission for the train split, whose labels are public")(_pr(split="train"))


@attack("review: the file swapped on the pull request after it was scored")
def swapped_after_scoring(work: Path, pristine: Path) -> str:
    from huggingface_hub import CommitOperationAdd, HfApi

    from nfn_baselines import hub_leaderboard

    scoring = hub_leaderboard.score_submission
    repo = f"census/{work.name}"

    def score_then_swap(*args: object, **kwargs: object) -> dict:
        scores = scoring(*args, **kwargs)
        HfApi().create_commit(repo, [CommitOperationAdd("submissions/syn/test/x.csv", b"checkpoint_id,x\n")],
                              repo_type="dataset", revision="refs/pr/1", commit_message="swap")
        return scores

    hub_leaderboard.score_submission = score_then_swap
    try:
        return _pr()(work, pristine)
    finally:
        hub_leaderboard.score_submission = scoring


@attack("stz verify: metadata with a float row, its sha256 rewritten (exit 1, one line)")
def verify_exit_code(work: Path, pristine: Path) -> str:
    import hashlib

    shutil.copytree(pristine, work / "zoo")
    config = work / "zoo" / "syn"
    manifest = json.loads((config / "zoo.json").read_text())
    relpath = manifest["metadata"]["train"]["path"]
    table = pq.read_table(config / relpath)
    rows = pa.array([r + 0.5 for r in table.column("row").to_pylist()])
    pq.write_table(table.set_column(table.schema.get_field_index("row"), pa.field("row", rows.type), rows),
                   config / relpath)
    data = (config / relpath).read_bytes()
    manifest["metadata"]["train"].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (config / "zoo.json").write_text(json.dumps(manifest))
    done = _in_subprocess("import sys; from small_transformer_zoo.cli import main; sys.exit(main(sys.argv[1:]))",
                          "verify", str(work / "zoo"))
    ok = done is not None and done.returncode == 1 and "column 'row'" in done.stdout + done.stderr
    return REFUSED if ok else f"other: exit {done.returncode if done else 'timeout'}"


start_hub()
