"""Provider API keys and MCP servers' header values join the redaction set (SPEC §15b;
issue 40 point 6) when they are stored and again when they are read for use (another
process, a restart), so an SDK's traceback that quotes one shows `***` in the log."""

from __future__ import annotations

import io
import logging
from urllib.parse import quote
from uuid import uuid4

from orchestra import redaction
from orchestra.db.models import McpServer, Provider
from orchestra.engine.tools.mcp.catalog import server_config
from orchestra.observability.logs import ContextFilter
from orchestra.services import mcp as mcp_service
from orchestra.services import providers


def logged(*values: str) -> str:
    """What a log line with a traceback quoting `values` reads like."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(ContextFilter())
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger(f"test.credentials.{uuid4().hex}")
    log.addHandler(handler)
    log.propagate = False
    try:
        raise RuntimeError("SDK request failed: " + ", ".join(f"{v} {quote(v, safe='')}" for v in values))
    except RuntimeError:
        log.exception("call failed with %s", values[0])
    return stream.getvalue()


async def test_provider_keys_and_mcp_headers_never_reach_a_log_line(core):
    key, header = f"sk-unit-{uuid4().hex}/+", f"hdr-{uuid4().hex}"
    await providers.create_provider(core, name="p", kind="openai_compatible", model_id="m", api_key=key,
                                    base_url="http://127.0.0.1:9/v1")
    await mcp_service.create_server(core, name="m", transport="streamable_http", url="http://127.0.0.1:9/mcp",
                                    headers={"Authorization": f"Bearer {header}"})
    out = logged(key, header)
    assert "Traceback" in out and "***" in out
    assert key not in out and quote(key, safe="") not in out and header not in out, out

    # another process (or this one after a restart) learns them when it reads them for use
    redaction.forget(key)
    redaction.forget(f"Bearer {header}")
    redaction.forget(header)
    assert key in logged(key)
    provider = await Provider.aget(Provider.name == "p")
    assert providers.decrypt_api_key(core, provider) == key
    config = server_config(await McpServer.aget(McpServer.name == "m"), core.secrets.decrypt)
    assert config.headers == {"Authorization": f"Bearer {header}"}
    out = logged(key, header)
    assert key not in out and header not in out, out
