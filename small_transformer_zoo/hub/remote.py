"""Reading files of a Hub dataset repo by HTTP range requests with a deadline, for streaming.

`datasets` wraps every remote read in up to 20 retries, and `huggingface_hub` each of those in up to 5 more, so a
server that stalls or cuts a transfer short keeps a streaming loop waiting for many minutes. The builder reads
shards and metadata through `open_remote` instead: each range request has a read timeout, a short transfer counts
as a failed attempt, and after `ATTEMPTS` attempts the read fails with a `ZooFormatError` naming the file.
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any
from urllib.parse import unquote

from ..errors import ZooFormatError, ZooHubError

HF_URL = re.compile(r"^hf://datasets/([^/@]+/[^/@]+)(?:@([^/]+))?/(.+)$")
TIMEOUT_SECONDS = 15.0
ATTEMPTS = 3
RETRY_WAIT_SECONDS = 1.0


def _reaches_end(content_range: str | None, received: int) -> bool:
    """Whether a 206 answer of `received` bytes ends where the file ends (`Content-Range: bytes a-b/total`)."""
    match = re.match(r"bytes (\d+)-(\d+)/(\d+)$", content_range or "")
    return bool(match) and int(match.group(2)) + 1 == int(match.group(3)) and \
        int(match.group(2)) - int(match.group(1)) + 1 == received


def content_matches(data: bytes, address: str | None) -> bool | None:
    """Whether `data` is the content the Hub's name for it says: an LFS file is named by its sha256, a regular file
    by its git blob sha1 (the ETag, which also names the blob in the Hugging Face cache). None: no such name."""
    if address is None or not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", address):
        return None
    if len(address) == 64:
        return hashlib.sha256(data).hexdigest() == address
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == address


def open_hub_or_local(url: str, download_config: Any) -> Any:
    """A shard, metadata or manifest file: `hf://` URLs through `RemoteFile`, anything else through `datasets`'
    `xopen` (local paths, other fsspec protocols)."""
    if url.startswith("hf://"):
        return RemoteFile(url, token=getattr(download_config, "token", None))
    from datasets.utils.file_utils import xopen

    return xopen(url, "rb", download_config=download_config)


class RemoteFile:
    """A read-only, seekable file over HTTP range requests (the subset of a file object the readers use)."""

    def __init__(self, hf_url: str, token: Any = None, timeout: float | None = None,
                 attempts: int | None = None) -> None:
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers

        match = HF_URL.match(hf_url)
        if match is None:
            raise ValueError(f"{hf_url!r} is not an hf://datasets/<owner>/<name>[@<revision>]/<path> URL")
        repo_id, revision, path = match.group(1), unquote(match.group(2) or "main"), match.group(3)
        self.name = hf_url
        self.url = hf_hub_url(repo_id, path, repo_type="dataset", revision=revision)
        self.headers = build_hf_headers(token=token)
        self.timeout, self.attempts = timeout or TIMEOUT_SECONDS, attempts or ATTEMPTS
        self.position = 0
        self.content_address: str | None = None  # the Hub's name for the file's content, from its last answer

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence != 0:
            raise ValueError("RemoteFile seeks from the start only")
        self.position = offset
        return offset

    def tell(self) -> int:
        return self.position

    def read(self, size: int = -1) -> bytes:
        """`size` bytes from the current position (fewer only at the end of the file); -1 reads to the end."""
        if size == 0:
            return b""
        wanted = f"bytes={self.position}-" + ("" if size < 0 else str(self.position + size - 1))
        data = self._get(wanted, size)
        self.position += len(data)
        return data

    def _get(self, byte_range: str, size: int) -> bytes:
        from huggingface_hub import get_session

        problem = ""
        for attempt in range(self.attempts):
            if attempt:
                time.sleep(RETRY_WAIT_SECONDS)
            try:
                response = get_session().get(self.url, headers={**self.headers, "Range": byte_range},
                                             timeout=self.timeout, follow_redirects=True)
            except Exception as exc:  # noqa: BLE001 - httpx raises timeouts, resets and protocol errors alike
                problem = f"{type(exc).__name__}: {' '.join(str(exc).split()) or 'no answer'}"
                continue
            if response.status_code == 416:  # a range that starts at the end of the file
                return b""
            if response.status_code == 404:
                raise FileNotFoundError(f"{self.name}: no such file in the repo")
            if response.status_code not in (200, 206):
                problem = f"HTTP {response.status_code}"
                if response.status_code < 500:
                    break
                continue
            data = response.content
            hub_answer = response.history[0] if response.history else response  # before any redirect to storage
            tag = hub_answer.headers.get("X-Linked-Etag") or hub_answer.headers.get("ETag")
            self.content_address = tag.removeprefix("W/").strip('"') if tag else None
            if response.status_code == 200:  # a server that ignores ranges sends the whole file
                start = int(byte_range[6:].split("-")[0])
                data = data[start:] if size < 0 else data[start : start + size]
            if size < 0 or len(data) == size or _reaches_end(response.headers.get("Content-Range"), len(data)):
                return data  # all of it, or all there is (a short file is the caller's to judge)
            problem = f"got {len(data)} of {size} bytes"
        raise ZooHubError(self.name, f"reading {byte_range} failed after {self.attempts} attempts ({problem})")

    def close(self) -> None:
        return None

    def __enter__(self) -> "RemoteFile":
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()
