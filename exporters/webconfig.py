"""TLS and basic auth for the exporter, from a web config file shaped like Prometheus's.

The file (``--web.config.file``) has the layout of the Prometheus exporter toolkit::

    tls_server_config:
      cert_file: server.crt        # relative paths are relative to this file
      key_file: server.key
      client_ca_file: ca.crt       # optional: ask clients for certificates
      client_auth_type: RequireAndVerifyClientCert   # optional
      min_version: TLS12           # optional: TLS10..TLS13 (default TLS12)
      max_version: TLS13           # optional: TLS10..TLS13 (default TLS13)
      cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]   # optional, Go names; TLS <= 1.2
      prefer_server_cipher_suites: true                          # optional
      curve_preferences: [X25519]  # optional: one curve (Python's ssl applies one only)
    http_server_config:
      http2: false                 # optional; only false (HTTP/1.1 is what is served)
      headers:                     # optional: added to every response
        X-Frame-Options: deny      # only the exporter toolkit's five security headers
    basic_auth_users:
      alice: $2y$10$...            # bcrypt hashes, never plain passwords

Every key is either applied or refused: a problem becomes one :class:`WebConfigError` line
naming the file and the key (a binary file, a bad bcrypt hash and a setting this server cannot
honour included). ``bcrypt`` is imported only when ``basic_auth_users`` is set.

Basic auth follows the exporter toolkit: one bcrypt check at a time (``BCRYPT_CONCURRENCY``:
guessing passwords cannot pin every core), an unknown user costs the same bcrypt check as a
known one (against a dummy hash of the same cost: user names cannot be probed by timing), and
only good credentials are cached (at most ``CACHE_SIZE``, oldest out first), under a keyed
digest, so wrong guesses can never flush a real scraper's entry.

Under a flood of logins (issue 20): at most ``BCRYPT_QUEUE`` logins wait for the bcrypt slot,
each at most ``BCRYPT_WAIT_S``; past either :class:`LoginsBusy` is raised (the server answers
429) instead of a wait longer than a scrape timeout, while cached credentials are answered at
once. With users of mixed bcrypt costs, every check costs what one at the highest cost does:
a user of cost ``c`` below the highest ``C`` is also checked against dummy hashes of costs
``c .. C-1`` (2^c + 2^c + ... + 2^(C-1) = 2^C), so no user's cost tells that it exists.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import ssl
import threading
from collections import OrderedDict
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
_TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                 "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
#: Go's cipher suite names (what exporter-toolkit configs hold) -> OpenSSL's. TLS 1.3 suites
#: are not configurable, in Go as here.
_CIPHERS = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
#: Go's curve names -> OpenSSL's.
_CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1",
           "X25519": "X25519"}
#: The response headers http_server_config.headers may set (as in the exporter toolkit).
_HEADERS = ("Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options",
            "X-XSS-Protection", "Strict-Transport-Security")
_BCRYPT = re.compile(r"^\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}$")
#: bcrypt checks that may run at once (the exporter toolkit allows one).
BCRYPT_CONCURRENCY = 1
#: Good credentials remembered (keyed digests); wrong ones are never cached.
CACHE_SIZE = 64
#: Logins that may wait for a bcrypt slot; more are refused at once (LoginsBusy, 429).
BCRYPT_QUEUE = 4
#: Seconds a login waits for a bcrypt slot before it is refused (LoginsBusy, 429).
BCRYPT_WAIT_S = 2.0


class LoginsBusy(Exception):
    """Too many logins are waiting for a bcrypt check: answer 429 and let the client retry."""


class WebConfigError(ValueError):
    """A web config file that cannot be used; one line naming the file and the problem."""


@dataclass
class WebConfig:
    """Validated web settings: an SSL context (or None) and the basic-auth users."""

    path: Path | None = None
    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)
    #: extra response headers (http_server_config.headers)
    headers: dict[str, str] = field(default_factory=dict)
    #: a hash of the users' cost that matches no password: unknown users are checked
    #: against it, so they take as long as known ones
    dummy_hash: bytes | None = None
    #: cost -> a hash of that cost matching no password, for every cost from the lowest
    #: user's to the highest (which is ``dummy_hash``): lower-cost users are padded with them
    pad_hashes: dict[int, bytes] = field(default_factory=dict, repr=False)
    #: logins refused because too many were waiting for bcrypt
    busy_refusals: int = 0
    _waiting: int = field(default=0, repr=False)
    _cache: OrderedDict[str, bool] = field(default_factory=OrderedDict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _bcrypt_slots: threading.Semaphore = field(
        default_factory=lambda: threading.BoundedSemaphore(BCRYPT_CONCURRENCY), repr=False)

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
        design; Prometheus scrapes every few seconds), never under the plain password; wrong
        ones are not cached. An unknown user is checked against ``dummy_hash`` (same cost).
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
        if not sep:
            return False
        known = self.users.get(user)
        hashed = known if known is not None else (self.dummy_hash or next(iter(
            self.users.values())))
        key = hmac.new(hashed, decoded.encode(), hashlib.sha256).hexdigest()
        if known is not None:
            with self._lock:
                if key in self._cache:
                    self._cache.move_to_end(key)
                    return True
        self._take_slot()  # one check at a time: guesses queue (boundedly), cores stay free
        try:
            ok = self._check(password.encode("utf-8"), hashed)
        finally:
            self._bcrypt_slots.release()
        if not ok or known is None:
            return False
        with self._lock:
            self._cache[key] = True
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return True


    def _take_slot(self) -> None:
        """Wait for the bcrypt slot, behind at most ``BCRYPT_QUEUE`` others and for at most
        ``BCRYPT_WAIT_S``; :class:`LoginsBusy` (counted) otherwise."""
        with self._lock:
            if self._waiting >= BCRYPT_QUEUE:
                self.busy_refusals += 1
                raise LoginsBusy("too many logins waiting")
            self._waiting += 1
        try:
            got = self._bcrypt_slots.acquire(timeout=BCRYPT_WAIT_S)
        finally:
            with self._lock:
                self._waiting -= 1
        if not got:
            with self._lock:
                self.busy_refusals += 1
            raise LoginsBusy("waited too long for a bcrypt check")

    def _check(self, password: bytes, hashed: bytes) -> bool:
        """bcrypt against ``hashed``, padded to the cost of the highest-cost user."""
        import bcrypt  # lazy: only installs with basic auth need it

        try:
            ok = bcrypt.checkpw(password, hashed)
        except ValueError:
            ok = False
        top = max(self.pad_hashes, default=0)
        for cost in range(_cost(hashed), top):  # each pad doubles: the sum is 2^top
            try:
                bcrypt.checkpw(password, self.pad_hashes[cost])
            except (ValueError, KeyError):
                pass
        return ok


def _cost(hashed: bytes) -> int:
    """The cost of a bcrypt hash (``$2b$10$...`` -> 10)."""
    return int(hashed[4:6])


def _load_yaml(path: Path) -> Any:
    import yaml

    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise WebConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise WebConfigError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise WebConfigError(f"{path}: not a text file (expected UTF-8 YAML)") from None
    if "\x00" in text:
        raise WebConfigError(f"{path}: not a text file (it holds NUL bytes)")
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


def _refuse_unknown(keys: Any, known: set[str] | frozenset[str], cfg_path: Path, where: str = "",
                    hint: str = "") -> None:
    """WebConfigError naming the ``keys`` not in ``known`` (``where``: the section), if any."""
    unknown = set(keys) - known
    if unknown:
        raise WebConfigError(f"{cfg_path}: unknown key(s){where}: "
                             f"{', '.join(sorted(map(str, unknown)))}{hint}")


def _tls_context(tls: Any, cfg_path: Path) -> ssl.SSLContext:
    if not isinstance(tls, dict):
        raise WebConfigError(f"{cfg_path}: tls_server_config must be a mapping")
    _refuse_unknown(tls, _TLS_KEYS, cfg_path, " in tls_server_config")
    for key in ("cert_file", "key_file"):
        if key not in tls:
            raise WebConfigError(f"{cfg_path}: tls_server_config needs {key}")
    base = cfg_path.parent
    cert = _file(base, tls["cert_file"], "cert_file", cfg_path)
    key = _file(base, tls["key_file"], "key_file", cfg_path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    versions = []
    for name, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        version = tls.get(name, default)
        if version not in _TLS_VERSIONS:
            raise WebConfigError(f"{cfg_path}: tls_server_config.{name} must be one of "
                                 f"{', '.join(_TLS_VERSIONS)} (got {version!r})")
        versions.append(_TLS_VERSIONS[version])
    if versions[0] > versions[1]:
        raise WebConfigError(f"{cfg_path}: tls_server_config.min_version is above max_version")
    ctx.minimum_version, ctx.maximum_version = versions
    _apply_ciphers(ctx, tls, cfg_path)
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


def _known_names(tls: dict, key: str, known: dict[str, str], what: str, cfg_path: Path, *,
                 unknown_word: str = "unknown", hint: str = "") -> list | None:
    """``tls[key]`` when set: a non-empty list of names all in ``known``; else WebConfigError
    saying it must be a list of ``what``, or naming the ones not known (then ``hint``)."""
    names = tls.get(key)
    if names is None:
        return None
    where = f"{cfg_path}: tls_server_config.{key}"
    if not isinstance(names, list) or not names:
        raise WebConfigError(f"{where} must be a list of {what}")
    unknown = [str(x) for x in names if x not in known]
    if unknown:
        raise WebConfigError(f"{where}: {unknown_word} {', '.join(unknown)}{hint}")
    return names


def _apply_ciphers(ctx: ssl.SSLContext, tls: dict, cfg_path: Path) -> None:
    """cipher_suites, prefer_server_cipher_suites and curve_preferences, applied or refused."""
    suites = _known_names(tls, "cipher_suites", _CIPHERS, "cipher suite names", cfg_path,
                          unknown_word="unknown or unsupported")
    if suites is not None:
        try:
            ctx.set_ciphers(":".join(dict.fromkeys(_CIPHERS[x] for x in suites)))
        except ssl.SSLError:
            raise WebConfigError(f"{cfg_path}: tls_server_config.cipher_suites: this OpenSSL "
                                 "offers none of them") from None
    prefer = tls.get("prefer_server_cipher_suites")
    if prefer is not None:
        if not isinstance(prefer, bool):
            raise WebConfigError(f"{cfg_path}: tls_server_config.prefer_server_cipher_suites "
                                 "must be true or false")
        if prefer:
            ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
        else:
            ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    curves = _known_names(tls, "curve_preferences", _CURVES, "curve names", cfg_path,
                          hint=f" (known: {', '.join(_CURVES)})")
    if curves is not None:
        if len(curves) > 1:
            raise WebConfigError(f"{cfg_path}: tls_server_config.curve_preferences: this "
                                 "server can apply one curve only (Python's ssl); list one")
        try:
            ctx.set_ecdh_curve(_CURVES[curves[0]])
        except (ValueError, ssl.SSLError):
            raise WebConfigError(f"{cfg_path}: tls_server_config.curve_preferences: this "
                                 f"OpenSSL cannot use {curves[0]}") from None


def _http_server_config(cfg: Any, cfg_path: Path) -> dict[str, str]:
    """http_server_config: ``http2: false`` accepted, ``headers`` applied, the rest refused."""
    if not isinstance(cfg, dict):
        raise WebConfigError(f"{cfg_path}: http_server_config must be a mapping")
    _refuse_unknown(cfg, {"http2", "headers"}, cfg_path, " in http_server_config")
    if cfg.get("http2") not in (None, False):
        raise WebConfigError(f"{cfg_path}: http_server_config.http2: this exporter serves "
                             "HTTP/1.1 only; set it to false or remove it")
    headers = cfg.get("headers") or {}
    if not isinstance(headers, dict):
        raise WebConfigError(f"{cfg_path}: http_server_config.headers must be a mapping")
    out = {}
    for name, value in headers.items():
        if name not in _HEADERS:
            raise WebConfigError(f"{cfg_path}: http_server_config.headers: {name!r} cannot be "
                                 f"set (allowed: {', '.join(_HEADERS)})")
        if not isinstance(value, str) or any(c in value for c in "\r\n\x00"):
            raise WebConfigError(f"{cfg_path}: http_server_config.headers.{name} must be one "
                                 "line of text")
        out[name] = value
    return out


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
        found = _BCRYPT.match(hashed)
        if found is None or not 4 <= int(found.group(1)) <= 31:
            raise WebConfigError(f"{cfg_path}: basic_auth_users.{user}: the bcrypt hash is "
                                 "malformed (truncated or edited?); make it again with "
                                 "htpasswd -nBC 10 \"\" | tr -d ':\\n'")
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
    _refuse_unknown(data, _TOP_KEYS, cfg_path, hint=f" (known: {', '.join(sorted(_TOP_KEYS))})")
    tls = data.get("tls_server_config")
    ctx = _tls_context(tls, cfg_path) if tls is not None else None
    server_cfg = data.get("http_server_config")
    headers = _http_server_config(server_cfg, cfg_path) if server_cfg is not None else {}
    users_cfg = data.get("basic_auth_users")
    users = _users(users_cfg, cfg_path) if users_cfg is not None else {}
    pads = _pad_hashes(users)
    return WebConfig(path=cfg_path, ssl_context=ctx, users=users, headers=headers,
                     dummy_hash=pads[max(pads)] if pads else None, pad_hashes=pads)


def _pad_hashes(users: dict[str, bytes]) -> dict[int, bytes]:
    """cost -> a bcrypt hash of a random secret, for every cost from the lowest among the
    users to the highest (empty without users). Checking an unknown user against the highest
    takes as long as a known user of that cost; the lower ones pad cheaper users to it."""
    if not users:
        return {}
    import bcrypt

    costs = [_cost(h) for h in users.values()]
    return {cost: bcrypt.hashpw(os.urandom(16).hex().encode(), bcrypt.gensalt(rounds=cost))
            for cost in range(min(costs), max(costs) + 1)}
