"""URLs given on the command line, split into what is requested, what is shown and the secret.

``http://user:PASS@host:9048/metrics`` names a server and a password. The password goes into
an HTTP basic ``Authorization`` header and nowhere else: labels, log lines, the store, the
exports and error messages get :attr:`SplitUrl.display` (no user information at all). Every
option that takes a URL goes through :func:`split_url` (``--rollout-server``,
``--phase-source``, the dashboard's and demo's ``--prometheus``); :func:`redact` removes user
information from any other text that may quote a URL (an exception's message).
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit, urlunsplit


class UrlError(ValueError):
    """A URL option that cannot be used; the message is one line without the secret."""


@dataclass(frozen=True)
class SplitUrl:
    """A URL without its user information, and that information for basic authentication."""

    url: str  # what is requested (no user information)
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @property
    def display(self) -> str:
        """The URL as labels, logs and messages may show it (never the user information)."""
        return self.url

    @property
    def has_credentials(self) -> bool:
        """Whether the URL carried a user name or password."""
        return self.username is not None or self.password is not None

    def auth_header(self) -> dict[str, str]:
        """``{"Authorization": "Basic ..."}`` for the URL's credentials, else ``{}``."""
        if not self.has_credentials:
            return {}
        pair = f"{self.username or ''}:{self.password or ''}".encode()
        return {"Authorization": "Basic " + base64.b64encode(pair).decode("ascii")}

    def auth_pair(self) -> tuple[str, str] | None:
        """(user, password) for clients that take them (httpx's ``auth``), else None."""
        if not self.has_credentials:
            return None
        return self.username or "", self.password or ""


def split_url(text: str, option: str = "URL") -> SplitUrl:
    """``text`` split into the URL to request and its credentials (percent-decoded).

    A scheme-less ``HOST:PORT`` (or ``user:pass@HOST:PORT``) is read as ``http://``. Raises
    :class:`UrlError` naming ``option`` (and never the password) when no host is left."""
    raw = str(text).strip()
    probe = raw if "://" in raw else "http://" + raw
    try:
        parts = urlsplit(probe)
        port = parts.port  # raises ValueError for a port that is not a number
    except ValueError as exc:
        raise UrlError(f"{option} {redact(raw)!r}: not a URL ({exc})") from None
    netloc = parts.netloc
    user = password = None
    if "@" in netloc:
        info, netloc = netloc.rsplit("@", 1)
        name, sep, secret = info.partition(":")
        user = unquote(name)
        password = unquote(secret) if sep else None
    if not parts.hostname:
        raise UrlError(f"{option} {redact(raw)!r}: no host in the URL")
    del port
    clean = urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))
    if "://" not in raw:
        clean = clean.removeprefix("http://")
    return SplitUrl(url=clean, username=user, password=password)


_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@'\"]*@")


def redact(text: object) -> str:
    """``text`` with the user information of every URL in it removed
    (``http://u:p@h/`` becomes ``http://h/``)."""
    return _USERINFO.sub(lambda m: m.group("scheme"), str(text))
