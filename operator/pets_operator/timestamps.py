"""Timestamps as the API server writes them (RFC 3339, UTC, whole seconds, 'Z'), and read back in either
form a client may hold."""

from __future__ import annotations

from datetime import UTC, datetime


def timestamp(now: datetime) -> str:
    """RFC 3339 the way the API server writes it (UTC, seconds, 'Z')."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(text: str) -> datetime:
    """RFC 3339 as the API server writes it ('...Z') or as the client serialises it ('...+00:00')."""
    value = datetime.fromisoformat(text)
    return value if value.tzinfo else value.replace(tzinfo=UTC)
