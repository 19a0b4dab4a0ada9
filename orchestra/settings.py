"""Typed settings read from ORCHESTRA_* environment variables; CLI flags override them."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any


def _default_home() -> Path:
    return Path(os.environ.get("ORCHESTRA_HOME") or Path.home() / ".orchestra").expanduser()


@dataclass(frozen=True)
class Settings:
    """Everything configurable. Build with `Settings.from_env(**overrides)`."""

    home: Path = field(default_factory=_default_home)
    database_url: str = ""
    secret_key: str = ""
    access_ttl: int = 15 * 60
    refresh_ttl: int = 7 * 24 * 3600
    rate_limit_register: str = "5/minute"
    rate_limit_login: str = "10/minute"
    limiter_storage: str = "async+memory://"
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    cors_origins: str = ""
    request_max_bytes: int = 1024 * 1024
    upload_max_bytes: int = 20 * 1024 * 1024
    # Argon2id cost: argon2-cffi's defaults (RFC 9106 low-memory profile).
    argon2_time_cost: int = 3
    argon2_memory_cost: int = 65536
    argon2_parallelism: int = 4
    hash_concurrency: int = 0  # 0: one hashing thread per core
    hash_queue: int = 64  # hashes waiting beyond the running ones before 503
    llm_timeout: float = 60.0
    llm_retries: int = 3
    llm_max_tool_rounds: int = 8
    sse_ping_seconds: float = 15.0
    sse_send_timeout: float = 30.0  # a stream reader that takes no bytes this long is closed
    run_lease_seconds: float = 15.0  # a run's owner renews its lease; past it, others take over
    run_max_attempts: int = 3  # claims of one run before it ends `interrupted`
    max_runs: int = 100  # runs one process executes at once; the rest wait `queued`
    shutdown_grace_seconds: float = 10.0  # on SIGTERM, how long in-flight steps may finish
    step_output_max_bytes: int = 1024 * 1024  # one step's output; past it the step fails
    header_timeout: float = 10.0  # seconds for a whole request head, from its first byte
    body_min_rate: int = 240  # bytes a second a body must average after header_timeout (0: off)
    access_log: bool = False

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> "Settings":
        """Read ORCHESTRA_<FIELD> variables, then apply non-None keyword overrides."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f"ORCHESTRA_{f.name.upper()}")
            if raw is None or raw == "":
                continue
            values[f.name] = _coerce(f.name, f.type, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls(**values)
        return settings.resolved()

    def resolved(self) -> "Settings":
        """Fill the defaults that derive from `home`."""
        home = Path(self.home).expanduser()
        url = self.database_url or f"sqlite:///{home / 'orchestra.db'}"
        return replace(self, home=home, database_url=url)

    @property
    def uploads_dir(self) -> Path:
        return self.home / "uploads"

    def ensure_home(self) -> None:
        """Create the home folder (private to the owner) if it is missing."""
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)

    def load_secret_key(self) -> str:
        """The signing secret: ORCHESTRA_SECRET_KEY, or one generated once into home (0600)."""
        if self.secret_key:
            return self.secret_key
        self.ensure_home()
        path = self.home / "secret_key"
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            pass
        key = secrets.token_urlsafe(48)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process won the race: use its key
            return path.read_text().strip()
        with os.fdopen(fd, "w") as handle:
            handle.write(key)
        return key


def _coerce(name: str, kind: Any, raw: str) -> Any:
    kind = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "bool":
            return raw.strip().lower() in {"1", "true", "yes", "on"}
        if kind == "Path":
            return Path(raw)
    except ValueError:
        raise ValueError(f"ORCHESTRA_{name.upper()} must be a {kind}, got {raw!r}") from None
    return raw
