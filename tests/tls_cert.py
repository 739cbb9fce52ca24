"""A throwaway TLS certificate for the exporter's web-config tests (openssl CLI)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def make_cert(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for localhost/127.0.0.1: (server.crt, server.key)."""
    crt, key = directory / "server.crt", directory / "server.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(crt), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )
    return crt, key
