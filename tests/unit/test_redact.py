"""URL redaction: userinfo and query strings never shown (pets_contract.redact)."""

import pytest

from pets_contract.redact import has_userinfo, redact_urls

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("text", "shown"), [
    ("https://user:secret@host/a.tar", "https://REDACTED@host/a.tar"),
    ("https://user:p@ss@host:8443/a.tar", "https://REDACTED@host:8443/a.tar"),
    ("https://token@host/a.tar", "https://REDACTED@host/a.tar"),
    ("http://host/a.tar?X-Amz-Signature=abc&X-Amz-Credential=k#frag", "http://host/a.tar?REDACTED"),
    ("s3://bucket/prefix", "s3://bucket/prefix"),
    ("http.client.InvalidURL: nonnumeric port: 'secret@host' in https://u:secret@host:x/a",
     "http.client.InvalidURL: nonnumeric port: 'secret@host' in https://REDACTED@host:x/a"),
    ("fetching https://a:b@h/x and http://h2/y?sig=1 failed",
     "fetching https://REDACTED@h/x and http://h2/y?REDACTED failed"),
    ("no url here: user@example.com", "no url here: user@example.com"),
])
def test_redact_urls(text: str, shown: str) -> None:
    assert redact_urls(text) == shown


def test_has_userinfo() -> None:
    assert has_userinfo("https://user:secret@host/a.tar")
    assert has_userinfo("https://@host/a.tar")
    assert not has_userinfo("https://host/a.tar?who=me@there")
    assert not has_userinfo("s3://bucket/prefix")


def test_the_sources_secrets_go_wherever_they_appear() -> None:
    url = "https://alice:s3cr3t@host:x/a.tar?sig=abcdef"
    text = "nonnumeric port: 'x' after 's3cr3t@host', user alice, query sig=abcdef"
    shown = redact_urls(text, url)
    assert "s3cr3t" not in shown and "alice" not in shown and "abcdef" not in shown
    assert redact_urls("a b c", "https://a:b@h/") == "a b c"  # too short to be told from text
