"""Typed settings read from ORCHESTRA_* environment variables; CLI flags override them."""

from __future__ import annotations

import os
import secrets
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from orchestra.egress import STEP_SETTING, EgressPolicy


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
    rate_limit_hook: str = "600/minute"  # calls of one inbound webhook (all senders together)
    limiter_storage: str = "async+memory://"
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    cors_origins: str = ""
    request_max_bytes: int = 1024 * 1024
    upload_max_bytes: int = 20 * 1024 * 1024
    upload_quota_bytes: int = 1024 * 1024 * 1024  # all of one user's stored uploads together
    # Argon2id cost: argon2-cffi's defaults (RFC 9106 low-memory profile).
    argon2_time_cost: int = 3
    argon2_memory_cost: int = 65536
    argon2_parallelism: int = 4
    hash_concurrency: int = 0  # 0: one hashing thread per core
    hash_queue: int = 64  # hashes waiting beyond the running ones before 503
    llm_timeout: float = 60.0
    llm_retries: int = 3
    llm_max_tokens: int = 4096  # a model answer's cap, sent with every call (what a budget reserves)
    llm_max_tool_rounds: int = 8
    schema_repairs: int = 2  # repair rounds of a structured answer that does not fit its schema
    sse_ping_seconds: float = 15.0
    sse_send_timeout: float = 30.0  # a stream reader that takes no bytes this long is closed
    sse_max_seconds: float = 0.0  # a stream ends (to be resumed) after this long; 0: never
    run_lease_seconds: float = 15.0  # a run's owner renews its lease; past it, others take over
    run_max_attempts: int = 3  # claims of one run before it ends `interrupted`
    max_runs: int = 100  # runs one process executes at once; the rest wait `queued`
    max_runs_per_user: int = 0  # runs of one owner one process executes at once (0: ORCHESTRA_MAX_RUNS alone)
    db_pool_size: int = 20  # store connections per process (PostgreSQL; requests and runs share them)
    db_busy_timeout: float = 10.0  # seconds a SQLite statement waits on another's lock before it fails
    shutdown_grace_seconds: float = 10.0  # on SIGTERM, how long in-flight steps may finish
    step_output_max_bytes: int = 1024 * 1024  # one step's output, UTF-8 bytes; past it the step fails
    prompt_max_bytes: int = 1024 * 1024  # one rendered prompt, UTF-8 bytes; past it the step fails
    foreach_max_items: int = 1000  # items one foreach may map; more fail the step
    expression_timeout_ms: int = 1000  # a sandboxed CEL evaluation's deadline (SPEC §15)
    expression_memory_mb: int = 512  # an expression worker's address space
    expression_input_max_bytes: int = 4 * 1024 * 1024  # JSON an expression is evaluated against
    expression_result_max_bytes: int = 4 * 1024 * 1024  # JSON a sandboxed expression may give
    expression_workers: int = 2  # expression worker processes, started when first needed
    code_timeout_ms: int = 1000  # one code step's run in its sandbox (SPEC §17)
    code_memory_mb: int = 64  # a code step's heap in its sandbox
    code_recursion_max: int = 200  # a code step's call depth
    code_workers: int = 2  # code sandbox worker processes per server process, started when first needed
    schema_timeout_ms: int = 1000  # a JSON Schema check too large for the event loop, in a worker
    header_timeout: float = 10.0  # seconds for a whole request head, from its first byte
    body_min_rate: int = 240  # bytes a second a body must average after header_timeout (0: off)
    response_timeout: float = 3600.0  # seconds a request may go without a byte in or out (503 beyond)
    access_log: bool = False
    console: bool = True
    log_format: str = "text"  # "text" or "json" (one object a line)
    metrics: bool = False  # GET /metrics (Prometheus)
    metrics_token: str = ""  # when set, GET /metrics needs it as a bearer token
    run_retention_days: int = 0  # ended runs older than this are deleted hourly (0: keep all)
    audit_retention_days: int = 365  # audit entries older than this are pruned hourly (0: keep all)
    mcp_stdio_commands: str = ""  # comma-separated bare names of commands a stdio MCP server may run
    egress_allow: str = ""  # CIDRs, addresses or host names (optional :port) providers and MCP servers may reach
    step_egress_allow: str = ""  # the same, for users' destinations: HTTP steps and subscriptions
    webhook_retry_hours: float = 24.0  # how long a failing outbound webhook delivery is retried
    # Caps per user and pacing (SPEC §15b): what one user may hold of what all share.
    max_schedules_per_user: int = 100  # schedules one user may have (422 past it)
    cron_seconds: bool = False  # schedules' cron may lead with a seconds field (tests, demos)
    max_subscriptions_per_user: int = 100  # event subscriptions one user may have (422 past it)
    child_tree_max_active: int = 256  # active runs in one tree of child runs (a step starting more fails)
    max_mcp_sessions_per_user: int = 50  # open /mcp sessions of one user per process; the oldest closes
    rate_limit_hook_unverified: str = "60/minute"  # hook calls that do not verify, per client address
    delivery_host_rate: float = 10.0  # event deliveries a second one process sends to one host

    @property
    def mcp_stdio_allowed(self) -> frozenset[str]:
        """The base names in ORCHESTRA_MCP_STDIO_COMMANDS (empty: no stdio server may start)."""
        return frozenset(part.strip() for part in self.mcp_stdio_commands.split(",") if part.strip())

    @property
    def egress(self) -> EgressPolicy:
        """The egress rule with ORCHESTRA_EGRESS_ALLOW's allowances (parsed once)."""
        return EgressPolicy.parse(self.egress_allow)

    @property
    def step_egress(self) -> EgressPolicy:
        """The users' egress rule (HTTP steps, outbound subscriptions) with
        ORCHESTRA_STEP_EGRESS_ALLOW's allowances; ORCHESTRA_EGRESS_ALLOW opens nothing here."""
        return EgressPolicy.parse(self.step_egress_allow, STEP_SETTING)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> Settings:
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

    def resolved(self) -> Settings:
        """Fill the defaults that derive from `home`."""
        home = Path(self.home).expanduser()
        url = self.database_url or f"sqlite:///{home / 'orchestra.db'}"
        if self.log_format not in ("text", "json"):
            raise ValueError(f"ORCHESTRA_LOG_FORMAT must be text or json, got {self.log_format!r}")
        EgressPolicy.parse(self.egress_allow)  # a bad entry stops the start, naming the setting
        EgressPolicy.parse(self.step_egress_allow, STEP_SETTING)
        for name in ("expression_timeout_ms", "expression_memory_mb", "expression_input_max_bytes",
                     "expression_result_max_bytes", "expression_workers", "schema_timeout_ms",
                     "code_timeout_ms", "code_memory_mb", "code_recursion_max", "code_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"ORCHESTRA_{name.upper()} must be at least 1, got {getattr(self, name)}")
        if not 0 < self.db_busy_timeout <= 3600:
            raise ValueError(f"ORCHESTRA_DB_BUSY_TIMEOUT must be above 0 and at most 3600 (seconds), "
                             f"got {self.db_busy_timeout}")
        if self.max_runs_per_user < 0:
            raise ValueError(f"ORCHESTRA_MAX_RUNS_PER_USER must be 0 (no cap) or more, got {self.max_runs_per_user}")
        for name in ("max_schedules_per_user", "max_subscriptions_per_user", "max_mcp_sessions_per_user",
                     "child_tree_max_active"):
            if getattr(self, name) < 1:
                raise ValueError(f"ORCHESTRA_{name.upper()} must be at least 1, got {getattr(self, name)}")
        if not self.delivery_host_rate > 0:
            raise ValueError(f"ORCHESTRA_DELIVERY_HOST_RATE must be above 0, got {self.delivery_host_rate}")
        if not 0 < self.webhook_retry_hours <= 24 * 30:
            raise ValueError(f"ORCHESTRA_WEBHOOK_RETRY_HOURS must be above 0 and at most 720, "
                             f"got {self.webhook_retry_hours}")
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
        expected = {"int": "an integer", "float": "a number"}.get(kind, f"a {kind}")
        raise ValueError(f"ORCHESTRA_{name.upper()} must be {expected}, got {raw!r}") from None
    return raw


# --- documentation: README's configuration table is generated from these -------------


@dataclass(frozen=True)
class SettingDoc:
    """What a setting means; `default` when the field's value is not what a reader should
    see (derived or computed defaults); `flag` for the command-line option that overrides it."""

    meaning: str
    default: str | None = None
    flag: str | None = None


# One entry per Settings field; tests/test_settings_docs.py fails when one is missing.
SETTING_DOCS: dict[str, SettingDoc] = {
    "home": SettingDoc("store, secret key, uploads, and the CLI's kept login", "`~/.orchestra`", "--home"),
    "database_url": SettingDoc(
        "`sqlite:////abs/path.db` or `postgresql://user:pass@host:5432/db` (install the `postgres` extra)",
        "`sqlite:///$ORCHESTRA_HOME/orchestra.db`", "--db"),
    "secret_key": SettingDoc("signs tokens, derives the key that encrypts provider API keys",
                             "generated once into `$ORCHESTRA_HOME/secret_key` (0600)"),
    "access_ttl": SettingDoc("access token lifetime, seconds"),
    "refresh_ttl": SettingDoc("refresh token lifetime, seconds"),
    "rate_limit_register": SettingDoc("register attempts per client address"),
    "rate_limit_login": SettingDoc("login attempts per client address"),
    "rate_limit_hook": SettingDoc(
        "verified calls of one inbound webhook, whoever sends them (429 for that hook only; calls "
        "that do not verify count against `ORCHESTRA_RATE_LIMIT_HOOK_UNVERIFIED`); per process "
        "unless `ORCHESTRA_LIMITER_STORAGE` is Redis"),
    "limiter_storage": SettingDoc(
        "where rate-limit counters live: `async+redis://host:6379` to share them between processes "
        "(install the `redis` extra)"),
    "host": SettingDoc("address `orchestra serve` binds", flag="--host"),
    "port": SettingDoc("port `orchestra serve` binds (1-65535)", flag="--port"),
    "workers": SettingDoc("server processes (more than 1 needs PostgreSQL)", flag="--workers"),
    "cors_origins": SettingDoc("comma-separated origins of a front end served elsewhere", "empty (CORS off)"),
    "request_max_bytes": SettingDoc("largest JSON body (413 beyond)"),
    "upload_max_bytes": SettingDoc("largest uploaded file (413 beyond)"),
    "upload_quota_bytes": SettingDoc(
        "bytes all of one user's stored uploads may take together; an upload that would pass it "
        "is refused whole (413, nothing kept)"),
    "argon2_time_cost": SettingDoc("argon2id passes per password hash"),
    "argon2_memory_cost": SettingDoc("argon2id memory per hash, KiB"),
    "argon2_parallelism": SettingDoc("argon2id lanes per hash"),
    "hash_concurrency": SettingDoc("password hashes computed at once", "`0` (one per core)"),
    "hash_queue": SettingDoc("hashes that may wait beyond the running ones before login/register answer 503"),
    "llm_timeout": SettingDoc("seconds to wait on a model provider's answer"),
    "llm_retries": SettingDoc("retries of a provider error that may pass (429, 5xx, timeouts)"),
    "llm_max_tokens": SettingDoc(
        "tokens a model's answer may take, sent with every call as max_tokens; a run's budget "
        "reserves this many at the output price before each call"),
    "llm_max_tool_rounds": SettingDoc("tool-call rounds an agent step may take"),
    "schema_repairs": SettingDoc(
        "times a model is told what was wrong and asked again when its answer does not match "
        "the step's output_schema"
    ),
    "sse_ping_seconds": SettingDoc("seconds between `: ping` comments on a quiet event stream"),
    "sse_send_timeout": SettingDoc("seconds a stream reader may take no bytes before it is disconnected"),
    "sse_max_seconds": SettingDoc(
        "an event stream ends after this many seconds with a `retry:` line, and the client resumes "
        "it with `Last-Event-ID` (for proxies that cap connection lifetimes; `0`: never)"),
    "run_lease_seconds": SettingDoc("a run's owner renews its lease; when it dies, others take the run over after this"),
    "run_retention_days": SettingDoc(
        "runs that ended more than this many days ago are deleted with their steps and events "
        "(and schedules' fire records and ended webhook deliveries of that age), "
        "at start and hourly, by one process at a time (`0` keeps every run; "
        "`orchestra db prune` does it by hand)"),
    "audit_retention_days": SettingDoc(
        "audit log entries older than this many days are deleted, each chain's oldest whole "
        "prefix, at start and hourly (the chain stays verifiable from its new first entry; "
        "`0` keeps every entry)"),
    "run_max_attempts": SettingDoc("claims of one run before it ends `interrupted`"),
    "max_runs": SettingDoc("runs one process executes at once; the rest wait `queued`. A run waiting "
                           "(for a reply, a child run, a retry delay) holds no slot"),
    "max_runs_per_user": SettingDoc(
        "runs of one owner one process executes at once (counted as `ORCHESTRA_MAX_RUNS` is); the owner's "
        "other runs stay `queued`, never refused", "`0` (no cap but `ORCHESTRA_MAX_RUNS`)"),
    "db_pool_size": SettingDoc(
        "store connections per process, shared by requests and runs (PostgreSQL; leases "
        "and signals have their own). Past it a request waits, then answers 503"),
    "db_busy_timeout": SettingDoc(
        "seconds a SQLite statement waits for a lock another connection or program holds; "
        "past it the statement fails and the store counts as out (writes are waited out, "
        "SPEC §6). SQLite only"),
    "shutdown_grace_seconds": SettingDoc(
        "on SIGTERM, how long in-flight steps may finish before runs are handed back"),
    "step_output_max_bytes": SettingDoc(
        "largest output of one step, in UTF-8 bytes (the step fails beyond; a longer human reply "
        "is 413, a longer tool result an error the model reads)"),
    "prompt_max_bytes": SettingDoc(
        "largest rendered prompt of one step (an agent step's prompt, a human step's question, "
        "an `ask_user` question), in UTF-8 bytes: the step fails beyond, before anything is stored"),
    "foreach_max_items": SettingDoc("items one `foreach` step may map; a longer list fails the step"),
    "expression_timeout_ms": SettingDoc(
        "milliseconds a CEL expression with a comprehension (`map`, `filter`, `all`, `exists`, "
        "`exists_one`), or over a large context, may run in its worker process; past it the "
        "worker is killed and the step fails naming this limit"),
    "expression_memory_mb": SettingDoc(
        "address space (MiB) of each expression worker process; an evaluation that needs more "
        "fails its step naming this limit"),
    "expression_input_max_bytes": SettingDoc(
        "bytes of JSON one expression may be evaluated against (the `input` and step outputs it "
        "names); more fails its step naming this limit"),
    "expression_result_max_bytes": SettingDoc(
        "bytes of JSON a sandboxed expression's value may have; more fails its step naming this limit"),
    "schema_timeout_ms": SettingDoc(
        "milliseconds a JSON Schema check too large for the event loop (a large value against a "
        "large schema) may take in an expression worker process; past it the value is refused "
        "(422 at start or reply; a failed structured answer) naming this limit"),
    "code_timeout_ms": SettingDoc(
        "milliseconds one code step may run in its sandbox (the step's `timeout_seconds` also "
        "applies, the smaller wins); past it the step fails naming this limit and the worker is replaced"),
    "code_memory_mb": SettingDoc(
        "heap (MiB) one code step may use in its sandbox; past it the step fails naming this limit"),
    "code_recursion_max": SettingDoc(
        "call depth a code step may reach; deeper fails the step naming this limit"),
    "code_workers": SettingDoc(
        "code sandbox worker processes (pydantic-monty) per server process, started at the first "
        "code step; further code steps wait their turn"),
    "expression_workers": SettingDoc(
        "expression worker processes per server process (started when first needed); further "
        "sandboxed evaluations wait their turn"),
    "header_timeout": SettingDoc(
        "seconds a client has to send a whole request head, from its first byte (408 and close beyond)"),
    "body_min_rate": SettingDoc(
        "bytes a second a request body (an upload too) must average once it has had "
        "`ORCHESTRA_HEADER_TIMEOUT` seconds (408 and close below; `0`: no minimum)"),
    "response_timeout": SettingDoc(
        "seconds a request may be handled without a byte received or sent (streams send pings); "
        "past it the request answers 503 `OverloadedError` with `Retry-After`, never 500"),
    "access_log": SettingDoc("log every request", flag="--access-log/--no-access-log"),
    "console": SettingDoc("serve the web console at `/` (`0`: off, and `/` is the JSON 404; docs/console.md)"),
    "log_format": SettingDoc(
        "`text`, or `json`: one object a line with `ts`, `level`, `msg`, `request_id`, `trace_id` "
        "(docs/operations.md, \"Monitoring\")"),
    "metrics": SettingDoc("serve Prometheus metrics at `GET /metrics` (off: 404)"),
    "metrics_token": SettingDoc(
        "when set, `GET /metrics` needs `Authorization: Bearer <token>` (401 without)", "empty (no token)"),
    "mcp_stdio_commands": SettingDoc(
        "comma-separated bare names of commands a stdio MCP server may run (e.g. `mcp-server-time,uvx`), "
        "looked up on the server's own PATH; "
        "checked when a server is saved and again at every start of its process", "empty (no stdio servers)"),
    "egress_allow": SettingDoc(
        "comma-separated CIDRs (`10.0.0.0/8`), addresses (exactly that address: `127.0.0.1`, `::1`) or "
        "host names, each optionally with `:port` (IPv6 in brackets: `[::1]:11434`), that the server's "
        "connections to model providers and MCP servers may reach although they are loopback, private, "
        "link-local, unique-local or otherwise not public (e.g. `127.0.0.1:11434` for a local Ollama); "
        "it opens nothing to HTTP steps or subscriptions (see `ORCHESTRA_STEP_EGRESS_ALLOW`)",
        "empty (public addresses only)"),
    "step_egress_allow": SettingDoc(
        "the same form as `ORCHESTRA_EGRESS_ALLOW`, for the users' destinations: the addresses that "
        "HTTP steps and outbound subscriptions (webhook deliveries) may reach although they are not "
        "public (e.g. `10.2.0.0/16` for an internal API); a refusal names this setting",
        "empty (public addresses only)"),
    "max_schedules_per_user": SettingDoc(
        "schedules one user may have; one more is 422 naming this setting"),
    "cron_seconds": SettingDoc(
        "lets a schedule's cron lead with a sixth field, seconds (`*/10 * * * * *`: every 10 s), "
        "for tests and demonstrations; off, a cron has five fields (SPEC §11)"),
    "max_subscriptions_per_user": SettingDoc(
        "outbound event subscriptions one user may have; one more is 422 naming this setting"),
    "child_tree_max_active": SettingDoc(
        "active runs (queued, running, waiting) in one tree of child runs: a root run and all its "
        "descendants; a workflow step that would start one more fails naming this setting"),
    "max_mcp_sessions_per_user": SettingDoc(
        "open handshake-era `/mcp` sessions of one user in one process; opening one more closes "
        "that user's oldest (the newest stays open; others' sessions are untouched)"),
    "rate_limit_hook_unverified": SettingDoc(
        "inbound webhook calls that do not verify (unsigned, forged, stale), per client address "
        "(429); they never count against the hook's own `ORCHESTRA_RATE_LIMIT_HOOK`"),
    "delivery_host_rate": SettingDoc(
        "event deliveries (subscriptions' signed POSTs) one process sends to one destination "
        "host a second; the rest wait their turn, none is dropped"),
    "webhook_retry_hours": SettingDoc(
        "hours an outbound event delivery (a subscription's webhook) is retried after its event "
        "while the receiver fails, with exponential backoff (first retry after about 5 s, at most "
        "an hour apart); then the delivery is `failed` (a manual retry tries again)"),
}

TABLE_START = "<!-- settings-table:start (generated: python -m orchestra.settings --write-readme) -->"
TABLE_END = "<!-- settings-table:end -->"


def undocumented_settings() -> list[str]:
    """Settings fields without an entry in SETTING_DOCS."""
    return [f.name for f in fields(Settings) if f.name not in SETTING_DOCS]


def _default_text(f: Any) -> str:
    doc = SETTING_DOCS[f.name]
    if doc.default is not None:
        return doc.default
    value = f.default
    if value is MISSING:
        value = f.default_factory()
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`" if value != "" else "empty"


def markdown_table() -> str:
    """README's configuration table: one row per Settings field, in field order."""
    missing = undocumented_settings()
    if missing:
        raise LookupError(f"settings without a doc in SETTING_DOCS: {', '.join(missing)}")
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for f in fields(Settings):
        doc = SETTING_DOCS[f.name]
        name = f"`ORCHESTRA_{f.name.upper()}`" + (f" (`{doc.flag}`)" if doc.flag else "")
        rows.append(f"| {name} | {_default_text(f)} | {doc.meaning} |")
    return "\n".join(rows)


def readme_with_table(readme: str) -> str:
    """`readme` with the text between the table markers replaced by `markdown_table()`."""
    start, end = readme.index(TABLE_START) + len(TABLE_START), readme.index(TABLE_END)
    return readme[:start] + "\n" + markdown_table() + "\n" + readme[end:]


def main(argv: list[str] | None = None) -> None:
    """`python -m orchestra.settings --markdown` prints the table; `--write-readme [PATH]`
    rewrites it in README.md (default: the one next to the package)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--write-readme"]:
        path = Path(args[1]) if len(args) > 1 else Path(__file__).resolve().parents[1] / "README.md"
        path.write_text(readme_with_table(path.read_text(encoding="utf-8")), encoding="utf-8")
        print(f"wrote the settings table into {path}")
    elif args[:1] == ["--markdown"]:
        print(markdown_table())
    else:
        raise SystemExit("usage: python -m orchestra.settings --markdown | --write-readme [README.md]")


if __name__ == "__main__":
    main()
