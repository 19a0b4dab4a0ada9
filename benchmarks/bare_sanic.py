"""The baseline for bench_auth.py: a bare Sanic app with one small JSON route.

Started like `orchestra serve` (one process, single worker, no access log), so the
ratio printed by the benchmark is what orchestra's own work costs on top of Sanic.
Run: `python benchmarks/bare_sanic.py --port 8001`, then GET /api/v1/auth/list.
"""

from __future__ import annotations

import argparse

from sanic import Request, Sanic
from sanic.response import json

BODY = {
    "message": "success",
    "users": [{"user_id": "0" * 32, "user_name": "admin", "role": "SUPER_ADMINISTRATOR"}],
}


def create_app() -> Sanic:
    """A minimal app: one GET route answering a small JSON body."""
    app = Sanic("bare_sanic")
    app.config.MOTD = False
    app.config.ACCESS_LOG = False

    @app.get("/api/v1/auth/list")
    async def users(request: Request):
        return json(BODY)

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    app = create_app()
    app.prepare(host=args.host, port=args.port, single_process=True, access_log=False, motd=False)
    Sanic.serve_single(primary=app)


if __name__ == "__main__":
    main()
