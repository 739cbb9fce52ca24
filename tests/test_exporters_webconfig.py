"""Web config loading: TLS and basic auth settings validated with one-line errors."""

from __future__ import annotations

import base64
import ssl

import bcrypt
import pytest
from tls_cert import make_cert

from exporters.webconfig import WebConfigError, load_web_config


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_no_file_means_plain_http():
    web = load_web_config(None)
    assert not web.tls and not web.auth_required
    assert web.check_authorization(None)


def test_tls_with_relative_paths_and_basic_auth(tmp_path):
    make_cert(tmp_path)
    hashed = bcrypt.hashpw(b"pa55word", bcrypt.gensalt(rounds=4)).decode()
    cfg = tmp_path / "web.yml"
    cfg.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                   f"basic_auth_users:\n  alice: '{hashed}'\n")
    web = load_web_config(cfg)
    assert web.tls and isinstance(web.ssl_context, ssl.SSLContext)
    assert web.ssl_context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert web.auth_required
    assert web.check_authorization(basic("alice", "pa55word"))
    assert web.check_authorization(basic("alice", "pa55word"))  # cached answer, same result
    assert not web.check_authorization(basic("alice", "wrong"))
    assert not web.check_authorization(basic("bob", "pa55word"))
    assert not web.check_authorization(None)
    assert not web.check_authorization("Basic !!!notbase64")
    assert not web.check_authorization("Bearer abc")


@pytest.mark.parametrize(
    "text, message",
    [
        ("tls_server_config: [1]\n", "tls_server_config must be a mapping"),
        ("tls_server_config:\n  cert_file: server.crt\n", "needs key_file"),
        ("tls_server_config:\n  cert_file: nope.crt\n  key_file: server.key\n",
         "nope.crt does not exist"),
        ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
         "  min_version: SSL3\n", "min_version must be one of"),
        ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
         "  client_auth_type: RequireAndVerifyClientCert\n", "needs client_ca_file"),
        ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
         "  colour: blue\n", "unknown key(s) in tls_server_config: colour"),
        ("tls_server_config:\n  cert_file: server.key\n  key_file: server.crt\n",
         "cannot load the certificate"),
        ("basic_auth_users:\n  alice: hunter2\n", "not a bcrypt hash"),
        ("basic_auth_users: []\n", "must map user names"),
        ("basic_auth: {}\n", "unknown key(s): basic_auth"),
        ("- a list\n", "expected a mapping"),
        ("tls_server_config: {cert_file: [\n", "not valid YAML"),
    ],
)
def test_bad_configs_give_one_line_errors(tmp_path, text, message):
    make_cert(tmp_path)
    cfg = tmp_path / "web.yml"
    cfg.write_text(text)
    with pytest.raises(WebConfigError) as info:
        load_web_config(cfg)
    assert message in str(info.value)
    assert str(cfg) in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(WebConfigError, match="no such file"):
        load_web_config(tmp_path / "absent.yml")
