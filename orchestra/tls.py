"""One TLS context for every outgoing HTTP client of the process (providers, MCP servers).

Building a context loads the system's CA certificates, ~15–20 ms of CPU; a client per
provider and an MCP session per run each built their own. A context is safe to share,
and `SSL_CERT_FILE` / `SSL_CERT_DIR` are honoured as httpx2 honours them.
"""

from __future__ import annotations

import functools
import ssl

import httpx2


@functools.cache
def client_tls() -> ssl.SSLContext:
    """The verifying context httpx2 would build for `verify=True`, built once."""
    return httpx2.create_ssl_context()
