"""The FastAPI peer for bench_auth.py: the same protected `GET /api/v1/auth/list`, written
as idiomatic async FastAPI.

A bearer access token (PyJWT, HS256) is decoded in a dependency and its user read from
the store, the route needs a super administrator (as full-stack-fastapi-template's
`get_current_active_superuser`), and the handler reads every user ordered by creation
and answers them through a response model. Everything is `async def` on one aiosqlite
connection (the template's plain-`def` SQLModel version, run in FastAPI's thread pool,
measured ~4x slower here, so it would flatter orchestra). Served by uvicorn with uvloop
and httptools, one process, no access log: started like bare_sanic.py and
`orchestra serve`.

Run: `python benchmarks/fastapi_peer.py --port 8002 --db /tmp/peer.db --users 20
--token-file /tmp/token`: it creates the users, writes the administrator's access token
to the token file, then serves. Needs the `bench` extra (`pip install -e '.[bench]'`).
"""

# No `from __future__ import annotations`: FastAPI reads the dependencies' annotations,
# and those name aliases local to create_app.
import argparse
import datetime as dt
import sqlite3
import uuid
from contextlib import asynccontextmanager
from typing import Annotated

import aiosqlite
import jwt
import uvicorn
from fastapi import Depends, FastAPI, HTTPException, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

SECRET = "fastapi-peer-secret-" + "z" * 32
SUPER = "SUPER_ADMINISTRATOR"
SCHEMA = """CREATE TABLE user (id TEXT PRIMARY KEY, user_name TEXT UNIQUE NOT NULL,
            role TEXT NOT NULL, password_hash TEXT NOT NULL, created_at TEXT NOT NULL)"""


class UserPublic(BaseModel):
    user_id: str
    user_name: str
    role: str


class UsersPublic(BaseModel):
    message: str
    users: list[UserPublic]


def create_app(database: str) -> FastAPI:
    store: dict[str, aiosqlite.Connection] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        store["db"] = await aiosqlite.connect(database)
        await store["db"].execute("PRAGMA journal_mode=wal")
        yield
        await store["db"].close()

    app = FastAPI(lifespan=lifespan)
    bearer = HTTPBearer()

    async def get_db() -> aiosqlite.Connection:
        return store["db"]

    Db = Annotated[aiosqlite.Connection, Depends(get_db)]

    async def get_current_user(db: Db, credentials: Annotated[HTTPAuthorizationCredentials, Depends(bearer)]):
        try:
            payload = jwt.decode(credentials.credentials, SECRET, algorithms=["HS256"])
        except jwt.PyJWTError:
            raise HTTPException(status.HTTP_403_FORBIDDEN, "Could not validate credentials") from None
        async with db.execute("SELECT id, user_name, role FROM user WHERE id = ?", (payload.get("sub"),)) as cur:
            user = await cur.fetchone()
        if user is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, "User not found")
        return user

    async def get_current_active_superuser(current_user: Annotated[tuple, Depends(get_current_user)]):
        if current_user[2] != SUPER:
            raise HTTPException(status.HTTP_403_FORBIDDEN, "The user doesn't have enough privileges")
        return current_user

    @app.get("/api/v1/auth/list", dependencies=[Depends(get_current_active_superuser)],
             response_model=UsersPublic)
    async def read_users(db: Db):
        async with db.execute("SELECT id, user_name, role FROM user ORDER BY created_at, id") as cur:
            rows = await cur.fetchall()
        return UsersPublic(message="success", users=[
            UserPublic(user_id=row[0], user_name=row[1], role=row[2]) for row in rows])

    return app


def seed(database: str, users: int) -> str:
    """A fresh store with `users` users, the first a super administrator; its access token."""
    admin = uuid.uuid4().hex
    with sqlite3.connect(database) as conn:
        conn.execute(SCHEMA)
        rows = [(admin, "bench_admin", SUPER)] + [
            (uuid.uuid4().hex, f"bench_user_{n:02d}", "USER") for n in range(users - 1)]
        conn.executemany(
            "INSERT INTO user VALUES (?, ?, ?, '', ?)",
            [(*row, f"2026-01-01T00:00:{i:02d}") for i, row in enumerate(rows)],
        )
    now = dt.datetime.now(dt.UTC)
    return jwt.encode({"sub": admin, "iat": now, "exp": now + dt.timedelta(hours=1)}, SECRET,
                      algorithm="HS256")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8002)
    parser.add_argument("--db", required=True, help="SQLite file (made fresh)")
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--token-file", required=True)
    args = parser.parse_args()
    token = seed(args.db, args.users)
    with open(args.token_file, "w") as handle:
        handle.write(token)
    uvicorn.run(create_app(args.db), host=args.host, port=args.port, workers=1, access_log=False,
                log_level="warning", loop="uvloop", http="httptools")


if __name__ == "__main__":
    main()
