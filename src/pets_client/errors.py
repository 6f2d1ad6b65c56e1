"""The client's exceptions: each says what went wrong and, where it can, what to do about it."""

from __future__ import annotations

import json
import re
from typing import Any

# What a terminal acts on rather than shows: ESC sequences (CSI ``ESC [ ... final``; the string
# sequences OSC, DCS, SOS, PM and APC up to their terminator BEL or ``ESC \\``, or to the end of the
# text; any other ``ESC x``), then the C0 controls but newline and tab, DEL and the C1 controls.
_ESC_SEQUENCE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]?|[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)?|.?)", re.DOTALL)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_text(text: object) -> str:
    """``text`` without what a terminal would act on instead of printing: ESC sequences (colours,
    cursor moves, window titles, OSC 8 links...), C0 controls but newline and tab (so no carriage
    return that overwrites a line, no backspace, no bell), DEL and the C1 controls. For text that comes
    from the cluster (status messages, conditions, Events, a pod's stderr) before the CLI prints it."""
    return _CONTROL.sub("", _ESC_SEQUENCE.sub("", str(text)))


class PetsClientError(Exception):
    """Base class of every error the client raises."""


class InvalidTrainingError(PetsClientError):
    """The API server refused a PetsTraining. The message is the server's, which names the field.

    ``fields`` lists the fields the server named (``spec.replicas``...), ``status`` is the HTTP status.
    """

    def __init__(self, message: str, *, fields: list[str] | None = None, status: int | None = None,
                 causes: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields or []
        self.status = status
        self.causes = causes or []


class TrainingNotFoundError(PetsClientError, LookupError):
    """No PetsTraining of that name in the namespace."""


class TrainingDeletedError(PetsClientError):
    """The PetsTraining was deleted while the client waited for it."""


class WaitTimeoutError(PetsClientError, TimeoutError):
    """The training did not finish in time. ``status`` is the last status seen."""

    def __init__(self, message: str, status: dict[str, Any]) -> None:
        super().__init__(message)
        self.status = status


class FetchError(PetsClientError):
    """The outputs cannot be fetched (an emptyDir output, a helper pod that did not start...)."""


class UploadError(PetsClientError):
    """A folder cannot be uploaded into a claim (a bad argument, a claim too small, a copy that does not
    match its sha256...). Raised for the arguments before anything is created."""


class TensorBoardError(PetsClientError):
    """TensorBoard cannot serve a training: no claim to read, a pod that did not start or ended, a local
    port taken."""


class LogsError(PetsClientError):
    """No logs to show: no pod of that rank, or its container has not started."""


def server_error(exc: Any) -> tuple[str, list[str], list[dict[str, Any]]]:
    """The message, the named fields and the causes of a kubernetes ApiException's Status body."""
    body = getattr(exc, "body", None)
    try:
        status = json.loads(body) if body else {}
    except (TypeError, ValueError):
        status = {}
    if not isinstance(status, dict):
        status = {}
    message = status.get("message") or getattr(exc, "reason", None) or str(exc)
    causes = [c for c in ((status.get("details") or {}).get("causes") or []) if isinstance(c, dict)]
    fields = [c["field"] for c in causes if c.get("field")]
    return str(message), fields, causes
