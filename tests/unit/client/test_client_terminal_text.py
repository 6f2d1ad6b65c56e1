"""What the cluster says reaches the terminal as text, never as control sequences (issue 28).

A training's status message comes from its pods (the operator mirrors what they report), a fetch
pod's stderr and a waiting container's message from the training's image: `kubectl pets` prints them
through errors.terminal_text, which drops ESC sequences, C0 controls but newline and tab, DEL and C1.
"""

from __future__ import annotations

import io
import random
from typing import Any

import pytest

from pets_client import cli
from pets_client.client import PetsTrainingClient, _Reporter
from pets_client.errors import FetchError, PetsClientError, terminal_text
from pets_client.transfer import STDERR_KEPT_BYTES, WsExec

pytestmark = pytest.mark.unit

HOSTILE = ("\x1b]0;owned\x07\x1b[2J\x1b[H\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\"
           "\rSucceeded\x08\x08\x00\x7f\x85\x9b31m\x1bP+q\x1b\\\x1b(B\x1b")
SHOWN = "clickSucceeded31mB"  # what is left of HOSTILE: its text, never a sequence


def _unsafe(text: str) -> list[str]:
    """The characters a terminal would act on: C0 but newline and tab, DEL, C1 (ESC among C0)."""
    return [c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7f <= ord(c) <= 0x9f]


@pytest.mark.parametrize(("raw", "shown"), [
    ("plain text, 日本語, émoji 🐶", "plain text, 日本語, émoji 🐶"),
    ("line one\nline two\tcol", "line one\nline two\tcol"),
    ("\x1b[31mred\x1b[0m", "red"),                                  # CSI: colours
    ("a\x1b[2J\x1b[10;1Hb", "ab"),                                 # CSI: clear screen, cursor move
    ("\x1b]0;window title\x07after", "after"),                     # OSC ended by BEL
    ("\x1b]8;;https://x\x1b\\link\x1b]8;;\x1b\\", "link"),         # OSC 8 hyperlink ended by ST
    ("\x1bP+q544e\x1b\\x", "x"),                                   # DCS (a terminal query)
    ("\x1b]52;c;cHduZWQ=", ""),                                    # OSC 52 (clipboard), unterminated
    ("a\x1bcb", "ab"),                                             # ESC c: full reset
    ("ok\x1b", "ok"),                                              # a lone ESC at the end
    ("50%\rFailed", "50%Failed"),                                  # CR: no overwriting the line
    ("a\x00b\x07c\x08d\x0be\x0cf\x7fg", "abcdefg"),                # NUL, BEL, BS, VT, FF, DEL
    ("a\x85b\x9b31mc\x9dd", "ab31mcd"),                            # C1: NEL, CSI, OSC
])
def test_terminal_text(raw: str, shown: str) -> None:
    assert terminal_text(raw) == shown


def test_terminal_text_takes_anything_and_is_idempotent() -> None:
    assert terminal_text(None) == "None" and terminal_text(12) == "12"
    assert terminal_text(HOSTILE) == SHOWN
    assert terminal_text(terminal_text(HOSTILE)) == terminal_text(HOSTILE)


def test_no_random_text_keeps_a_control_character() -> None:
    """A seeded stand-in for a hypothesis property: whatever the text, nothing a terminal acts on
    is left, and printable text (letters, digits, punctuation, non-Latin) goes through unchanged."""
    rng = random.Random(28)
    alphabet = [chr(i) for i in range(0x00, 0xa0)] + list("é日🐶[];\\") + ["\x1b[", "\x1b]", "\x1bP", "\x07"]
    for _ in range(5000):
        raw = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        out = terminal_text(raw)
        assert not _unsafe(out), repr(raw)
        assert terminal_text(out) == out
    printable = "".join(chr(i) for i in range(0x20, 0x7f)) + "é日🐶\n\t"
    assert terminal_text(printable) == printable


def test_wait_prints_status_messages_as_text() -> None:
    buf = io.StringIO()
    reporter = _Reporter("pets", True, buf)
    reporter.update({"phase": "Pending", "message": HOSTILE})
    reporter.update({"phase": "Running", "message": "pod pets-0: " + HOSTILE, "epoch": 0, "totalEpochs": 2})
    reporter.close({"phase": "Failed", "message": HOSTILE, "epoch": 1, "totalEpochs": 2})
    out = buf.getvalue()
    assert "pets: Pending: " + SHOWN in out
    assert "pets: Failed, epoch 1/2, " + SHOWN in out
    assert not [c for c in _unsafe(out) if c not in "\r\x1b"], "only tqdm's own CR and ESC"
    assert "owned" not in out and "evil.example" not in out and "\x1b]" not in out and "\x1b[2J" not in out


class FakePets:
    namespace = "ns"

    def __init__(self, status: dict[str, Any] | None = None, items: list[dict[str, Any]] | None = None,
                 error: Exception | None = None) -> None:
        self.status, self.items, self.error = status or {}, items or [], error

    def wait(self, name: str, timeout: float | None = None, progress: bool = True) -> dict[str, Any]:
        if self.error:
            raise self.error
        return self.status

    def list(self) -> list[dict[str, Any]]:
        return self.items


def _main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], pets: FakePets,
          *argv: str) -> tuple[int, str, str]:
    monkeypatch.setattr(cli, "_client", lambda args: pets)
    code = cli.main(list(argv))
    got = capsys.readouterr()
    return code, got.out, got.err


def test_the_cli_prints_a_failed_message_as_text(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    pets = FakePets({"phase": "Failed", "message": HOSTILE})
    code, out, err = _main(monkeypatch, capsys, pets, "wait", "p")
    assert code == 1 and err == "p Failed: " + SHOWN + "\n" and not _unsafe(out + err.strip())


@pytest.mark.parametrize("error", [PetsClientError(HOSTILE), FetchError(HOSTILE)])
def test_the_cli_prints_errors_as_text(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                       error: Exception) -> None:
    code, _, err = _main(monkeypatch, capsys, FakePets(error=error), "wait", "p")
    assert code == 1 and err == "error: " + SHOWN + "\n"


def test_the_list_table_prints_cells_as_text(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    items = [{"metadata": {"name": "p"}, "spec": {"replicas": 2},
              "status": {"phase": "Running\x1b[8m\nhidden", "epoch": 1, "totalEpochs": "2\r\x1b[1A"}}]
    code, out, _ = _main(monkeypatch, capsys, FakePets(items=items), "list")
    assert code == 0 and not _unsafe(out.replace("\n", "")) and len(out.splitlines()) == 2
    assert "Running hidden" in out and "1/2 " in out


class FakeResp:
    """A kubernetes exec stream: ``frames`` of stdout, then stderr and an exit code."""

    def __init__(self, frames: int, frame: bytes, stderr: bytes = b"", code: int = 0) -> None:
        self.frames, self.frame, self.stderr, self.returncode = frames, frame, stderr, code
        self.sent = 0
        self.closed = False

    def is_open(self) -> bool:
        return self.sent < self.frames

    def update(self, timeout: float) -> None:
        pass

    def peek_stdout(self) -> bool:
        return True

    def read_stdout(self, timeout: float | None = None) -> bytes:
        if self.sent >= self.frames:
            return b""
        self.sent += 1
        return self.frame

    def peek_stderr(self) -> bool:
        return bool(self.stderr)

    def read_stderr(self, timeout: float | None = None) -> bytes:
        out, self.stderr = self.stderr, b""
        return out

    def close(self) -> None:
        self.closed = True


def _exec(monkeypatch: pytest.MonkeyPatch, resp: FakeResp, limit: int) -> bytes:
    import kubernetes.stream

    pets = PetsTrainingClient.__new__(PetsTrainingClient)
    pets.namespace = "ns"
    pets.core = type("Core", (), {"connect_get_namespaced_pod_exec": None})()
    monkeypatch.setattr(kubernetes.stream, "stream", lambda *a, **k: resp)
    return pets._exec_bytes("pod", ["sh", "-c", "true"], limit)


def test_a_fetch_pods_stderr_is_shown_as_text(monkeypatch: pytest.MonkeyPatch) -> None:
    resp = FakeResp(0, b"", stderr=HOSTILE.encode() + b"\xff" * 10_000, code=3)
    with pytest.raises(FetchError, match="exit 3") as err:
        _exec(monkeypatch, resp, 100)
    assert not _unsafe(str(err.value)) and SHOWN in str(err.value)
    assert len(str(err.value)) < 5000, "a pod's stderr is kept to its first 4 KiB"


def test_a_pods_stderr_is_read_to_its_end_and_kept_to_its_first_4_kib() -> None:
    class Flood(FakeResp):
        def __init__(self) -> None:
            super().__init__(0, b"")
            self.pieces = [bytes([65 + i % 26]) * 3000 for i in range(1000)]  # 3 MB, frame by frame

        def peek_stderr(self) -> bool:
            return bool(self.pieces)

        def read_stderr(self, timeout: float | None = None) -> bytes:
            return self.pieces.pop(0)

    resp = Flood()
    pod = WsExec(resp, FetchError, 100, role="fetch")
    while resp.pieces:
        pod._drain()
    assert bytes(pod.stderr) == b"A" * 3000 + b"B" * (STDERR_KEPT_BYTES - 3000)


def test_a_fetch_pod_that_floods_stdout_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    resp = FakeResp(10**9, b"x" * 65536)
    with pytest.raises(FetchError, match="more than the 200000 bytes"):
        _exec(monkeypatch, resp, 200_000)
    assert resp.sent == 4 and resp.closed
    assert _exec(monkeypatch, FakeResp(3, b"abc"), 9) == b"abcabcabc"
