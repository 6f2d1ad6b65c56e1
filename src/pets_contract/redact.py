"""Redaction of URLs before they are shown: a URL's userinfo and its query string are where credentials
ride (``https://user:secret@host/``, a presigned ``?X-Amz-Signature=...``), so neither reaches a log line,
a status field, an Event or a log tail. Pure and stdlib-only: the operator, which has no torch, uses it too.
"""

from __future__ import annotations

import re

REDACTED = "REDACTED"
# scheme://[userinfo@]host[/path][?query][#fragment], anywhere in a text. Userinfo ends at the
# authority's last '@'. A URL ends at whitespace or a quote, so a URL inside JSON leaves it valid.
_URL = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)"
    r"(?:(?P<userinfo>[^\s/?#\"'<>\\]*)@)?"
    r"(?P<rest>[^\s?#\"'<>\\]*)"
    r"(?P<query>\?[^\s#\"'<>\\]*)?"
    r"(?P<fragment>#[^\s\"'<>\\]*)?"
)


def _redacted(match: re.Match[str]) -> str:
    userinfo = f"{REDACTED}@" if match["userinfo"] is not None else ""
    query = f"?{REDACTED}" if match["query"] else ""
    return f"{match['scheme']}{userinfo}{match['rest']}{query}"


def redact_urls(text: str, *sources: str) -> str:
    """``text`` with every URL's userinfo and query string replaced by REDACTED (fragments dropped).

    The secret parts of each of ``sources`` go wherever they appear, in a URL or not: an error may quote
    a piece of the URL it could not parse (``nonnumeric port: 'secret@host'``)."""
    text = _URL.sub(_redacted, text)
    for source in sources:
        for secret in sorted(_secrets(source), key=len, reverse=True):
            text = text.replace(secret, REDACTED)
    return text


def _secrets(url: str) -> set[str]:
    """The userinfo of ``url``, its user and password, and its query string: each 3 characters or more,
    so that a one-letter user name does not redact every such letter of a message."""
    match = _URL.match(url)
    if not match:
        return set()
    parts = {(match["query"] or "")[1:]}
    if match["userinfo"] is not None:
        parts |= {match["userinfo"], *match["userinfo"].split(":", 1)}
    return {part for part in parts if len(part) >= 3}


def has_userinfo(url: str) -> bool:
    """True when ``url`` carries ``user[:password]@`` before its host."""
    match = _URL.match(url)
    return bool(match and match["userinfo"] is not None)
