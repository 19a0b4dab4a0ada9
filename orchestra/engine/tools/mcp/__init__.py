"""Tools from MCP servers (SPEC §9): `client` connects with the official SDK, `sessions`
holds one session per server per run, `catalog` lists the servers' tools as a source of
the tool registry."""
