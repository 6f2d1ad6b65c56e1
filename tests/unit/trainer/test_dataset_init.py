"""The dataset initializer against a real HTTP server on localhost: archives, digests, the cache."""

import hashlib
import http.server
import io
import json
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from pets_training import dataset_init
from pets_training.dataset_init import Source, SourceError, initialize
from pets_training.synthetic import write_synthetic

pytestmark = pytest.mark.unit


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A plain web server on localhost serving the folder it returns."""
    root = tmp_path / "www"
    root.mkdir()
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()
    server.server_close()


def _images(tmp_path: Path) -> Path:
    folder = tmp_path / "pets" / "images"
    write_synthetic(folder, 2, 3, 24, 7)
    (folder / "Abyssinian_9.mat").write_bytes(b"MATLAB")
    return folder.parent


def _tar_gz(src: Path, dest: Path) -> str:
    with tarfile.open(dest, "w:gz") as tar:
        tar.add(src, arcname=src.name)
    return hashlib.sha256(dest.read_bytes()).hexdigest()


def test_an_archive_is_fetched_once_and_then_served_from_the_cache(
        tmp_path: Path, served: tuple[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    base, www = served
    digest = _tar_gz(_images(tmp_path), www / "pets.tar.gz")
    source = Source(f"{base}/pets.tar.gz", digest)
    cache = tmp_path / "cache"
    first = initialize(cache, source)
    assert first["downloaded"] is True and first["images"] == 6
    # the archive's one top folder is looked into: the Oxford layout under it
    assert sorted(p.name for p in (cache / "data").iterdir()) == ["images"]
    assert sorted(p.name for p in cache.iterdir()) == [".complete", ".lock", "data"]
    (www / "pets.tar.gz").unlink()  # a second fetch would fail now
    with caplog.at_level("INFO"):
        second = initialize(cache, source)
    assert second["downloaded"] is False and second["images"] == 6
    assert "nothing to download" in caplog.text
    # another digest is another source: the cache does not serve it
    with pytest.raises(SourceError, match=r"spec.dataset.url: .*pets.tar.gz answered HTTP 404"):
        initialize(cache, Source(f"{base}/pets.tar.gz", "0" * 64))


def test_a_wrong_digest_names_the_field_and_leaves_no_data(tmp_path: Path, served: tuple[str, Path]) -> None:
    base, www = served
    digest = _tar_gz(_images(tmp_path), www / "pets.tar.gz")
    wrong = "f" * 64
    with pytest.raises(SourceError, match=rf"spec.dataset.sha256: the archive at .* has sha256 {digest} "
                                          rf"\(\d+ bytes\), not the {wrong} the spec expects"):
        initialize(tmp_path / "cache", Source(f"{base}/pets.tar.gz", wrong))
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".lock"]


def test_a_zip_of_a_folder_per_class_is_read(tmp_path: Path, served: tuple[str, Path]) -> None:
    base, www = served
    flat = tmp_path / "flat"
    write_synthetic(flat, 2, 3, 24, 7)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for p in sorted(flat.iterdir()):
            zf.write(p, f"{p.name.rsplit('_', 1)[0]}/{p.name}")
    (www / "set.zip").write_bytes(buffer.getvalue())
    record = initialize(tmp_path / "cache", Source(f"{base}/set.zip"))
    assert record["images"] == 6
    classes = sorted(p.name for p in (tmp_path / "cache" / "data").iterdir())
    assert classes == ["Abyssinian", "american_bulldog"]


@pytest.mark.parametrize("name, content, message", [
    ("notes.tar.gz", None, r"spec.dataset.url: .* holds no images the trainer can read"),
    ("page.html", b"<html>not an archive</html>", r"spec.dataset.url: .* is not a .tar, .tar.gz or .zip"),
])
def test_an_archive_without_images_or_not_an_archive_is_refused(
        tmp_path: Path, served: tuple[str, Path], name: str, content: bytes | None, message: str) -> None:
    base, www = served
    if content is None:
        notes = tmp_path / "notes"
        notes.mkdir()
        (notes / "README.txt").write_text("no pictures here")
        _tar_gz(notes, www / name)
    else:
        (www / name).write_bytes(content)
    with pytest.raises(SourceError, match=message):
        initialize(tmp_path / "cache", Source(f"{base}/{name}"))


def test_a_member_outside_the_folder_is_refused(tmp_path: Path, served: tuple[str, Path]) -> None:
    base, www = served
    with tarfile.open(www / "evil.tar", "w") as tar:
        data = b"x"
        info = tarfile.TarInfo("../../escaped.jpg")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(SourceError, match="spec.dataset.url"):
        initialize(tmp_path / "cache", Source(f"{base}/evil.tar"))
    assert not (tmp_path / "escaped.jpg").exists()


def test_an_unreachable_source_is_permanent_after_its_tries(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dataset_init.time, "sleep", lambda s: None)
    with pytest.raises(SourceError, match=r"spec.dataset.url: http://127.0.0.1:9/x.tar cannot be reached "
                                          r"\(.*\), tried 3 times"):
        initialize(tmp_path / "cache", Source("http://127.0.0.1:9/x.tar"))


def test_main_exits_78_and_writes_the_reason_for_the_operator(tmp_path: Path,
                                                              served: tuple[str, Path]) -> None:
    base, _www = served
    summary = tmp_path / "termination-log"
    code = dataset_init.main(["--url", f"{base}/missing.tar.gz", "--cache", str(tmp_path / "c"),
                              "--summary-path", str(summary)])
    assert code == 78
    record = json.loads(summary.read_text())
    assert record["status"] == "failed" and record["error"].startswith("spec.dataset.url: ")


def test_a_long_reason_is_cut_to_a_termination_message_that_is_still_json(tmp_path: Path) -> None:
    summary = tmp_path / "termination-log"
    url = f"http://127.0.0.1:9/{'a' * 5000}.tar"
    code = dataset_init.main(["--url", url, "--cache", str(tmp_path / "c"), "--summary-path", str(summary)])
    text = summary.read_text()
    assert code == 78 and len(text.encode()) <= 4096 and json.loads(text)["error"].endswith(" [cut]")


@pytest.mark.parametrize("url", [
    "https://user:s3cr3t-pass@127.0.0.1:notaport/pets.tar",  # http.client.InvalidURL (was exit 1)
    "http://127.0.0.1:9/pets.tar?X-Amz-Signature=s3cr3t-pass",  # unreachable, a presigned query
])
def test_any_source_failure_is_permanent_and_the_secret_never_shown(
        tmp_path: Path, url: str, capfd: pytest.CaptureFixture[str]) -> None:
    """An error nobody foresaw fails at once (exit 78, restarts 0), naming the field; neither the
    termination message nor the log carries the URL's userinfo or query string."""
    summary = tmp_path / "termination-log"
    code = dataset_init.main(["--url", url, "--cache", str(tmp_path / "c"), "--summary-path", str(summary)])
    assert code == 78
    error = json.loads(summary.read_text())["error"]
    assert error.startswith("spec.dataset.url: ") and "127.0.0.1" in error
    out, err = capfd.readouterr()
    for text in (error, out, err):
        assert "s3cr3t" not in text and "user" not in text.split("spec.dataset.url")[-1]
    assert "REDACTED" in error
