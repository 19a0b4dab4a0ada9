"""The HTTP layer: Sanic app, auth guards, limits, SSE, one blueprint per API area."""
