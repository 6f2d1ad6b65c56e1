"""The dataset initializer: fetch spec.dataset.url once into a cache directory that the ranks read.

Run as the init container of every trainer pod (`pets-dataset-init`), with the training's dataset cache
claim mounted read-write at ``--cache``. Its layout:

    .lock       flock'ed while one pod fetches; the other ranks wait for it, then find the data there
    .complete   JSON written last: the source, its sha256, and what was fetched (files, bytes, seconds)
    data/       the extracted archive, or the objects under the S3 prefix; the trainer reads it read-only

A cache that holds ``.complete`` for the same source and digest is used as it is: the next training on
the same data downloads nothing, and its log says so. Anything a restart cannot fix exits 78
(PermanentError) with a message that names the spec field: a source that cannot be reached, a digest
that does not match, credentials the server refuses, an archive with no images, and any error not
foreseen: a restart fetches the same source the same way. No line it writes carries a URL's userinfo or
query string (``redact``).

What it writes is bounded by ``--cache-size`` (spec.dataset.cache.size, which the operator passes): the
download, the objects, and an archive's members (``archive``: its own member check, and an expansion
ratio), each refused from its stated size before it is written.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from pets_contract import exits
from pets_contract.redact import redact_urls

from .archive import ArchiveError, blocks, quantity_bytes, unpack
from .contract import PermanentError
from .data import DataError, list_samples
from .progress import write_summary

log = logging.getLogger("pets-dataset-init")

COMPLETE = ".complete"
LOCK = ".lock"
DATA = "data"
CHUNK = 1 << 20
TRIES = 3  # a connection that fails is tried again, after 2 s and 4 s: a refusal (4xx) is not


class SourceError(PermanentError):
    """The dataset source cannot give the data: the message names the spec field."""


@dataclass(frozen=True)
class Source:
    url: str
    sha256: str | None = None
    layout: str = "auto"
    s3_endpoint: str | None = None
    s3_region: str | None = None
    credentials_secret: str | None = None  # named in errors; the keys come in the environment
    cache_size: str | None = None  # spec.dataset.cache.size: what is written stops there (archive.py)

    @property
    def is_s3(self) -> bool:
        return self.url.startswith("s3://")

    def key(self) -> dict[str, Any]:
        """What a cache must hold to serve this source: the same URL, digest and S3 endpoint."""
        return {"url": self.url, "sha256": self.sha256, "s3Endpoint": self.s3_endpoint}

    @property
    def cap(self) -> int | None:
        return None if self.cache_size is None else quantity_bytes("spec.dataset.cache.size", self.cache_size)

    def too_large(self, what: str, size: int) -> SourceError:
        return SourceError(f"spec.dataset.cache.size: {what} ({size} bytes or more) does not fit in the "
                           f"cache's {self.cache_size} ({self.cap} bytes): nothing more was written, and "
                           "what was is removed. Give spec.dataset.cache.size more room")


def cached(cache: Path, source: Source) -> dict[str, Any] | None:
    """The cache's record when it holds this source, complete; else None."""
    try:
        record = json.loads((cache / COMPLETE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("source") != source.key() or not (cache / DATA).is_dir():
        return None
    return record


@contextmanager
def locked(cache: Path) -> Iterator[None]:
    """One fetcher at a time per cache: the ranks of a training (and trainings on the same data) start
    together, and all but the first wait here, then find the data complete."""
    with open(cache / LOCK, "a+") as handle:
        started = time.monotonic()
        fcntl.flock(handle, fcntl.LOCK_EX)
        waited = time.monotonic() - started
        if waited > 1:
            log.info("waited %.0f s for another pod fetching into this cache", waited)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _open_url(url: str, timeout: float) -> BinaryIO:
    request = urllib.request.Request(url, headers={"User-Agent": "pets-dataset-init"})
    for attempt in range(1, TRIES + 1):
        try:
            return urllib.request.urlopen(request, timeout=timeout)  # type: ignore[no-any-return]
        except urllib.error.HTTPError as err:
            raise SourceError(f"spec.dataset.url: {url} answered HTTP {err.code} {err.reason}") from err
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            if attempt == TRIES:
                raise SourceError(
                    f"spec.dataset.url: {url} cannot be reached ({reason}), tried {TRIES} times") from err
            log.warning("fetching %s: %s; trying again in %d s", url, reason, 2**attempt)
            time.sleep(2**attempt)
    raise AssertionError("unreachable")


def download(source: Source, dest: Path, timeout: float = 60.0) -> tuple[str, int]:
    """Stream the source's URL into ``dest``, no more than its cap; returns its sha256 and size.
    Progress every 10 s in the log."""
    url, cap = source.url, source.cap
    digest, size, last = hashlib.sha256(), 0, time.monotonic()
    with _open_url(url, timeout) as response, open(dest, "wb") as out:
        total = response.headers.get("Content-Length") if hasattr(response, "headers") else None
        if cap is not None and total and total.isdigit() and blocks(int(total)) > cap:
            raise source.too_large(f"the archive at {url}", int(total))
        while chunk := response.read(CHUNK):
            if cap is not None and blocks(size + len(chunk)) > cap:
                raise source.too_large(f"the archive at {url}", size + len(chunk))
            out.write(chunk)
            digest.update(chunk)
            size += len(chunk)
            if time.monotonic() - last > 10:
                last = time.monotonic()
                log.info("downloaded %d of %s bytes", size, total or "?")
    return digest.hexdigest(), size


def data_root(extracted: Path) -> Path:
    """An archive that holds one folder (``pets/images/...``, as most do) is read from inside it."""
    entries = [p for p in extracted.iterdir() if not p.name.startswith(".") and p.name != "__MACOSX"]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else extracted


def check_images(root: Path, source: Source) -> int:
    try:
        listing = list_samples(root, source.layout)
    except DataError as err:
        raise SourceError(f"spec.dataset.url: {source.url} holds no images the trainer can read: {err}") \
            from err
    return len(listing.samples)


def fetch_http(source: Source, work: Path) -> Path:
    archive = work / "archive"
    digest, size = download(source, archive)
    if source.sha256 and digest != source.sha256.lower():
        raise SourceError(f"spec.dataset.sha256: the archive at {source.url} has sha256 {digest} ({size} "
                          f"bytes), not the {source.sha256} the spec expects")
    log.info("downloaded %s: %d bytes, sha256 %s%s", source.url, size, digest,
             " (matches spec.dataset.sha256)" if source.sha256 else "")
    try:
        members, written = unpack(archive, work / "extracted", f"the archive at {source.url}", source.cap,
                                  source.cache_size or "")
    except ArchiveError as err:
        raise SourceError(str(err)) from None
    log.info("unpacked %d members, %d bytes counted in 4 KiB blocks (%.1f times the archive)", members,
             written, written / max(1, size))
    archive.unlink()
    return data_root(work / "extracted")


def s3_error_code(err: Exception) -> str:
    """The S3 error code: S3Error's, or the <Code> of an error body the client could not parse (some
    servers send their XML errors as text/plain, which MinIO's client refuses)."""
    code = getattr(err, "code", None)
    if isinstance(code, str) and code:
        return code
    found = re.search(r"<Code>([A-Za-z]+)</Code>", str(err))
    return found.group(1) if found else type(err).__name__


CREDENTIALS_REFUSED = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken")


def fetch_s3(source: Source, work: Path) -> Path:
    """Every object under the prefix, its key relative to the prefix as its path (MinIO's S3 client,
    which speaks to any S3 server). The keys come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY."""
    from urllib.parse import urlparse

    from minio import Minio
    from minio.error import InvalidResponseError, S3Error
    from urllib3.exceptions import HTTPError

    bucket, _, prefix = source.url[len("s3://"):].partition("/")
    endpoint = urlparse(source.s3_endpoint or "https://s3.amazonaws.com")
    where = source.s3_endpoint or "AWS S3"
    secret = f"the Secret {source.credentials_secret!r}" if source.credentials_secret else \
        "no Secret (spec.dataset.s3.credentialsSecret is unset)"
    s3 = Minio(endpoint.netloc, access_key=os.environ.get("AWS_ACCESS_KEY_ID"),
               secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY"), secure=endpoint.scheme == "https",
               region=source.s3_region or "us-east-1")
    dest = (work / "objects").resolve()
    count = written = 0
    try:
        for obj in s3.list_objects(bucket, prefix=prefix, recursive=True):
            name = str(obj.object_name)
            relative = name[len(prefix):].lstrip("/")
            if obj.is_dir or not relative:
                continue
            target = (dest / relative).resolve()
            if dest not in target.parents:
                raise SourceError(f"spec.dataset.url: the object key {name!r} leads outside the dataset "
                                  "folder")
            written += blocks(obj.size or 0)
            if source.cap is not None and written > source.cap:
                raise source.too_large(f"the objects under {source.url}", written)
            target.parent.mkdir(parents=True, exist_ok=True)
            _get_object(s3, bucket, name, target, obj.size or 0)
            count += 1
    except (S3Error, InvalidResponseError) as err:
        code = s3_error_code(err)
        if code in CREDENTIALS_REFUSED:
            raise SourceError(f"spec.dataset.s3.credentialsSecret: {where} refused the credentials of "
                              f"{secret} for {source.url} ({code})") from err
        if code == "NoSuchBucket":
            raise SourceError(f"spec.dataset.url: {where} has no bucket {bucket!r}") from err
        raise SourceError(f"spec.dataset.url: {where} answered {code} for {source.url}") from err
    except (HTTPError, OSError) as err:
        raise SourceError(f"spec.dataset.s3.endpoint: {where} cannot be reached for {source.url} "
                          f"({type(err).__name__})") from err
    if count == 0:
        raise SourceError(f"spec.dataset.url: no object under {source.url} at {where}")
    log.info("downloaded %d objects from %s at %s", count, source.url, where)
    return dest


def _get_object(s3: Any, bucket: str, name: str, target: Path, size: int) -> None:
    """One object into ``target``, no more than the ``size`` its listing gave (which the cap counted)."""
    response = s3.get_object(bucket, name)
    try:
        with open(target, "wb") as out:
            for chunk in response.stream(CHUNK):
                if out.tell() + len(chunk) > size:
                    raise SourceError(f"spec.dataset.url: the object {name!r} sent more than the {size} "
                                      "bytes its listing gave: refused")
                out.write(chunk)
    finally:
        response.close()
        response.release_conn()


def initialize(cache: Path, source: Source) -> dict[str, Any]:
    """The data in ``cache/data``, fetched unless already there; returns the cache's record."""
    cache.mkdir(parents=True, exist_ok=True)
    with locked(cache):
        record = cached(cache, source)
        if record is not None:
            log.info("dataset cached: %s (%d images, fetched %s): nothing to download", source.url,
                     record.get("images", 0), record.get("fetchedAt", "?"))
            return {**record, "downloaded": False}
        started = time.monotonic()
        work = cache / ".incoming"
        shutil.rmtree(work, ignore_errors=True)  # what a fetcher that died left
        work.mkdir()
        try:
            root = fetch_s3(source, work) if source.is_s3 else fetch_http(source, work)
            images = check_images(root, source)
            shutil.rmtree(cache / DATA, ignore_errors=True)
            root.rename(cache / DATA)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        record = {"source": source.key(), "images": images,
                  "fetchedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "seconds": round(time.monotonic() - started, 2)}
        tmp = cache / f"{COMPLETE}.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, cache / COMPLETE)
        log.info("dataset fetched into the cache in %.1f s: %d images", record["seconds"], images)
        return {**record, "downloaded": True}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pets-dataset-init", description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="http(s):// archive or s3://bucket/prefix")
    p.add_argument("--sha256", help="the archive's expected sha256 (http only)")
    p.add_argument("--cache", required=True, type=Path, help="the cache directory (the claim's root)")
    p.add_argument("--layout", default="auto", choices=("auto", "flat", "oxford", "imagefolder"))
    p.add_argument("--s3-endpoint")
    p.add_argument("--s3-region")
    p.add_argument("--credentials-secret", help="the Secret the S3 keys come from (named in errors)")
    p.add_argument("--cache-size", help="spec.dataset.cache.size (a quantity, such as 5Gi): nothing written "
                   "into the cache passes it (unset: no cap but the expansion ratio)")
    p.add_argument("--summary-path", type=Path, help="where a failure's JSON goes (the termination log)")
    return p


class RedactingFilter(logging.Filter):
    """Every record with its URLs' userinfo and query strings redacted, whoever logged it (urllib3 too),
    and the secret parts of the source's URL wherever they appear."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact_urls(record.getMessage(), self.url), None
        return True


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s [dataset] %(message)s",
                        datefmt="%H:%M:%S")
    args = parser().parse_args(argv)
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter(args.url))
    source = Source(args.url, args.sha256, args.layout, args.s3_endpoint, args.s3_region,
                    args.credentials_secret, args.cache_size)
    try:
        initialize(args.cache, source)
    except PermanentError as err:
        return _fail(args.summary_path, redact_urls(str(err), source.url))
    except Exception as err:  # noqa: BLE001 - unforeseen: a restart would fetch the same way again
        return _fail(args.summary_path, redact_urls(f"spec.dataset.url: fetching {source.url} failed: "
                                                    f"{type(err).__name__}: {err}", source.url))
    return 0


def _fail(summary_path: Path | None, error: str) -> int:
    """Exit 78 with the (redacted) error in the log and the termination message."""
    log.error("%s (permanent: exit %d, a restart cannot fix this)", error, exits.PERMANENT)
    if summary_path:
        write_summary({"status": "failed", "error": error}, [summary_path])  # a long error cut to fit
    return exits.PERMANENT


if __name__ == "__main__":
    raise SystemExit(main())
