"""What `wait` shows while a training runs: pure functions from a PetsTraining's status to a bar's
state and to the lines it prints. No Kubernetes, no tqdm here, so they are unit-tested as they are."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BarState:
    """Where the progress bar stands: ``n`` of ``total`` ``unit``s, with the latest metrics."""

    n: int
    total: int | None
    unit: str
    postfix: dict[str, str] = field(default_factory=dict)


def _int(value: Any) -> int | None:
    try:
        return None if value is None or isinstance(value, bool) else int(value)
    except (TypeError, ValueError):
        return None


def _float(value: Any) -> float | None:
    try:
        return None if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None


def postfix(status: dict[str, Any]) -> dict[str, str]:
    """loss, acc and img/s from status, formatted; absent values are left out."""
    out: dict[str, str] = {}
    loss = _float(status.get("trainLoss"))
    if loss is not None:
        out["loss"] = f"{loss:.4f}"
    acc = _float(status.get("evalAccuracy"))
    if acc is not None:
        out["acc"] = f"{100 * acc:.1f}%"
    ips = _float(status.get("imagesPerSecond"))
    if ips is not None:
        out["img/s"] = f"{ips:.1f}"
    return out


def bar_state(status: dict[str, Any]) -> BarState:
    """Steps (``step``/``stepsTotal``) when the operator reports them, else epochs
    (``epoch``/``totalEpochs``), else an empty bar of unknown length."""
    steps_total = _int(status.get("stepsTotal"))
    if steps_total:
        n = min(max(_int(status.get("step")) or 0, 0), steps_total)
        return BarState(n, steps_total, "step", postfix(status))
    total_epochs = _int(status.get("totalEpochs"))
    if total_epochs:
        n = min(max(_int(status.get("epoch")) or 0, 0), total_epochs)
        return BarState(n, total_epochs, "epoch", postfix(status))
    return BarState(0, None, "step", postfix(status))


def phase_line(name: str, old: dict[str, Any] | None, new: dict[str, Any]) -> str | None:
    """A line to print when the phase or the message changed (a Pending reason, a restart...), else None."""
    old = old or {}
    phase, message = new.get("phase"), new.get("message")
    if phase == old.get("phase") and message == old.get("message"):
        return None
    if not phase and not message:
        return None
    text = f"{name}: {phase or 'no status yet'}"
    return f"{text}: {message}" if message else text


def final_line(name: str, status: dict[str, Any]) -> str:
    """One line for the end: the phase, the accuracy and the epochs, or why it failed."""
    phase = status.get("phase") or "unknown"
    parts = [f"{name}: {phase}"]
    acc = _float(status.get("evalAccuracy"))
    summary = status.get("summary") if isinstance(status.get("summary"), dict) else {}
    final = _float(summary.get("final_accuracy")) if summary else None
    acc = final if final is not None else acc
    if acc is not None:
        parts.append(f"final accuracy {acc:.4f} ({100 * acc:.1f}%)")
    epoch, total = _int(status.get("epoch")), _int(status.get("totalEpochs"))
    if epoch is not None and total:
        parts.append(f"epoch {epoch}/{total}")
    if phase != "Succeeded" and status.get("message"):
        parts.append(str(status["message"]))
    return ", ".join(parts)


def final_accuracy(status: dict[str, Any]) -> float | None:
    summary = status.get("summary") if isinstance(status.get("summary"), dict) else {}
    final = _float(summary.get("final_accuracy")) if summary else None
    return final if final is not None else _float(status.get("evalAccuracy"))
