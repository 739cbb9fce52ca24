"""TLS and basic auth for the exporter, from a web config file shaped like Prometheus's.

The file (``--web.config.file``) has the layout of the Prometheus exporter toolkit::

    tls_server_config:
      cert_file: server.crt        # relative paths are relative to this file
      key_file: server.key
      client_ca_file: ca.crt       # optional: ask clients for certificates
      client_auth_type: RequireAndVerifyClientCert   # optional
      min_version: TLS12           # optional: TLS12 (default) or TLS13
    basic_auth_users:
      alice: $2y$10$...            # bcrypt hashes, never plain passwords

Everything is checked when the file is loaded; a problem becomes one :class:`WebConfigError`
line naming the file and the key. ``bcrypt`` is imported only when ``basic_auth_users`` is set.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_TOP_KEYS = {"tls_server_config", "basic_auth_users", "http_server_config"}
_TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version",
             "max_version", "cipher_suites", "prefer_server_cipher_suites", "curve_preferences"}
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}


class WebConfigError(ValueError):
    """A web config file that cannot be used; one line naming the file and the problem."""


@dataclass
class WebConfig:
    """Validated web settings: an SSL context (or None) and the basic-auth users."""

    path: Path | None = None
    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)
    _cache: dict[str, bool] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def tls(self) -> bool:
        """True when the server speaks HTTPS."""
        return self.ssl_context is not None

    @property
    def auth_required(self) -> bool:
        """True when requests need basic-auth credentials."""
        return bool(self.users)

    def check_authorization(self, header: str | None) -> bool:
        """True when the ``Authorization`` header carries a known user and the right password.

        Good answers are cached under a keyed digest of the credentials (bcrypt is slow by
        design; Prometheus scrapes every few seconds), never under the plain password.
        """
        if not self.users:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            return False
        user, sep, password = decoded.partition(":")
        if not sep or user not in self.users:
            return False
        key = hmac.new(self.users[user], decoded.encode(), hashlib.sha256).hexdigest()
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None:
            return cached
        import bcrypt  # lazy: only installs with basic auth need it

        try:
            ok = bcrypt.checkpw(password.encode("utf-8"), self.users[user])
        except ValueError:
            ok = False
        with self._lock:
            if len(self._cache) > 1024:
                self._cache.clear()
            self._cache[key] = ok
        return ok


def _load_yaml(path: Path) -> Any:
    import yaml

    try:
        text = path.read_text()
    except FileNotFoundError:
        raise WebConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise WebConfigError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise WebConfigError(f"{path}: not valid YAML{line}") from None


def _file(base: Path, value: Any, key: str, cfg_path: Path) -> Path:
    if not isinstance(value, str) or not value:
        raise WebConfigError(f"{cfg_path}: tls_server_config.{key} must be a file path")
    p = Path(value)
    if not p.is_absolute():
        p = base / p
    if not p.is_file():
        raise WebConfigError(f"{cfg_path}: tls_server_config.{key}: {p} does not exist")
    return p


def _tls_context(tls: Any, cfg_path: Path) -> ssl.SSLContext:
    if not isinstance(tls, dict):
        raise WebConfigError(f"{cfg_path}: tls_server_config must be a mapping")
    unknown = set(tls) - _TLS_KEYS
    if unknown:
        raise WebConfigError(f"{cfg_path}: unknown key(s) in tls_server_config: "
                             f"{', '.join(sorted(unknown))}")
    for key in ("cert_file", "key_file"):
        if key not in tls:
            raise WebConfigError(f"{cfg_path}: tls_server_config needs {key}")
    base = cfg_path.parent
    cert = _file(base, tls["cert_file"], "cert_file", cfg_path)
    key = _file(base, tls["key_file"], "key_file", cfg_path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    version = tls.get("min_version", "TLS12")
    if version not in _TLS_VERSIONS:
        raise WebConfigError(f"{cfg_path}: tls_server_config.min_version must be one of "
                             f"{', '.join(_TLS_VERSIONS)} (got {version!r})")
    ctx.minimum_version = _TLS_VERSIONS[version]
    try:
        ctx.load_cert_chain(certfile=str(cert), keyfile=str(key))
    except (ssl.SSLError, OSError) as exc:
        raise WebConfigError(f"{cfg_path}: cannot load the certificate {cert} with key {key} "
                             f"({getattr(exc, 'reason', None) or exc})") from None
    auth = tls.get("client_auth_type", "NoClientCert")
    if auth not in _CLIENT_AUTH:
        raise WebConfigError(f"{cfg_path}: tls_server_config.client_auth_type must be one of "
                             f"{', '.join(_CLIENT_AUTH)} (got {auth!r})")
    ctx.verify_mode = _CLIENT_AUTH[auth]
    if "client_ca_file" in tls:
        ca = _file(base, tls["client_ca_file"], "client_ca_file", cfg_path)
        try:
            ctx.load_verify_locations(cafile=str(ca))
        except (ssl.SSLError, OSError) as exc:
            raise WebConfigError(f"{cfg_path}: cannot load client_ca_file {ca} ({exc})") from None
    elif ctx.verify_mode != ssl.CERT_NONE:
        raise WebConfigError(f"{cfg_path}: client_auth_type {auth} needs client_ca_file")
    return ctx


def _users(users: Any, cfg_path: Path) -> dict[str, bytes]:
    if not isinstance(users, dict) or not users:
        raise WebConfigError(f"{cfg_path}: basic_auth_users must map user names to bcrypt hashes")
    out = {}
    for user, hashed in users.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise WebConfigError(f"{cfg_path}: basic_auth_users: bad user name {user!r}")
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise WebConfigError(f"{cfg_path}: basic_auth_users.{user} is not a bcrypt hash "
                                 "(store hashes, never passwords)")
        out[user] = hashed.encode()
    try:
        import bcrypt  # noqa: F401 - checked now so a missing package fails at startup
    except ImportError:
        raise WebConfigError(f"{cfg_path}: basic_auth_users needs the bcrypt package "
                             "(pip install bcrypt)") from None
    return out


def load_web_config(path: str | Path | None) -> WebConfig:
    """Read and validate a web config file; None gives plain HTTP without auth.

    Raises :class:`WebConfigError` with one line naming the file and the problem.
    """
    if path is None:
        return WebConfig()
    cfg_path = Path(path)
    data = _load_yaml(cfg_path)
    if data is None:
        return WebConfig(path=cfg_path)
    if not isinstance(data, dict):
        raise WebConfigError(f"{cfg_path}: expected a mapping at the top level")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise WebConfigError(f"{cfg_path}: unknown key(s): {', '.join(sorted(unknown))} "
                             f"(known: {', '.join(sorted(_TOP_KEYS))})")
    tls = data.get("tls_server_config")
    ctx = _tls_context(tls, cfg_path) if tls is not None else None
    users_cfg = data.get("basic_auth_users")
    users = _users(users_cfg, cfg_path) if users_cfg is not None else {}
    return WebConfig(path=cfg_path, ssl_context=ctx, users=users)
