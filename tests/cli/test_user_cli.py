"""`orchestra user …` straight against the store: CliRunner in process, plus one real process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestra.core import Core
from orchestra.db.models import RefreshToken, User
from orchestra.services import auth
from tests.conftest import FAST_HASH, make_settings

PASSWORD = "password-123"
SECRET = "cli-secret-" + "c" * 32


@pytest.fixture
def env(tmp_path: Path) -> dict:
    home = tmp_path / "home"
    return {
        "ORCHESTRA_HOME": str(home),
        "ORCHESTRA_DATABASE_URL": f"sqlite:///{home / 'orchestra.db'}",
        "ORCHESTRA_SECRET_KEY": SECRET,
        "COLUMNS": "200",
        **{f"ORCHESTRA_{k.upper()}": str(v) for k, v in FAST_HASH.items()},
    }


def store(env: dict, fn):
    """Run `fn(core)` against the CLI's store and return its result."""

    async def go():
        settings = make_settings(Path(env["ORCHESTRA_HOME"]), env["ORCHESTRA_DATABASE_URL"],
                                 secret_key=SECRET)
        core = await Core.open(settings)
        try:
            return await fn(core)
        finally:
            await core.close()

    return asyncio.run(go())


def listed(cli) -> list[dict]:
    result = cli("user", "list", "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def create(cli, name: str, role: str | None = None, password: str = PASSWORD):
    args = ["user", "create", name, "--password-stdin"] + (["--role", role] if role else [])
    return cli(*args, input=password + "\n")


def one_error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.output
    return lines[0]


def test_create_with_password_stdin_and_list_json(cli, env):
    result = create(cli, "root", "SUPER_ADMINISTRATOR")
    assert result.exit_code == 0, result.output
    assert "created root (SUPER_ADMINISTRATOR)" in result.stderr
    assert create(cli, "alice").exit_code == 0
    users = listed(cli)
    assert [(u["user_name"], u["role"]) for u in users] == [("root", "SUPER_ADMINISTRATOR"), ("alice", "USER")]
    assert set(users[0]) == {"user_id", "user_name", "role", "created_at"}
    assert users[0]["created_at"].endswith("Z")
    hashes = store(env, lambda core: core.db.list(User.select(User.password_hash)))
    assert all(h.password_hash.startswith("$argon2id$") for h in hashes)
    assert PASSWORD not in json.dumps(users)


def test_table_list(cli):
    create(cli, "root", "SUPER_ADMINISTRATOR")
    result = cli("user", "list")
    assert result.exit_code == 0
    assert "root" in result.stdout and "SUPER_ADMINISTRATOR" in result.stdout


def test_create_refuses_bad_input(cli):
    assert create(cli, "root").exit_code == 0
    result = create(cli, "ROOT")
    assert result.exit_code == 4 and "taken" in one_error_line(result)
    result = create(cli, "a b")
    assert result.exit_code == 2 and "user_name" in one_error_line(result)
    result = create(cli, "bob", password="short")
    assert result.exit_code == 2 and "password" in one_error_line(result)
    result = cli("user", "create", "bob", "--password-stdin", input="")
    assert result.exit_code == 2 and "no password" in one_error_line(result)
    result = create(cli, "bob", "EMPEROR")
    assert result.exit_code == 2 and "unknown role 'EMPEROR'" in one_error_line(result)
    assert [u["user_name"] for u in listed(cli)] == ["root"]


def test_promote_demote_set_role(cli, env):
    create(cli, "root", "SUPER_ADMINISTRATOR")
    create(cli, "alice")
    result = cli("user", "promote", "alice")
    assert result.exit_code == 0 and "alice is now SUPER_ADMINISTRATOR" in result.stderr
    result = cli("user", "demote", "ALICE", "--to", "administrator")  # role names ignore case
    assert result.exit_code == 0 and "alice is now ADMINISTRATOR" in result.stderr
    alice_id = listed(cli)[1]["user_id"]
    result = cli("user", "set-role", alice_id, "USER")  # by user_id too
    assert result.exit_code == 0
    assert {u["user_name"]: u["role"] for u in listed(cli)} == {"root": "SUPER_ADMINISTRATOR", "alice": "USER"}
    result = cli("user", "set-role", "alice", "KING")
    assert result.exit_code == 2 and "unknown role" in one_error_line(result)
    result = cli("user", "promote", "alice", "--to", "nope")
    assert result.exit_code == 2


def test_promote_only_raises_and_demote_only_lowers(cli):
    create(cli, "root", "SUPER_ADMINISTRATOR")
    create(cli, "bob", "ADMINISTRATOR")
    result = cli("user", "promote", "bob", "--to", "USER")
    line = one_error_line(result)
    assert result.exit_code == 2
    assert line == ("error: bob is ADMINISTRATOR: promote only raises a role; "
                    "use 'orchestra user set-role bob USER' to set it to USER")
    result = cli("user", "demote", "bob", "--to", "SUPER_ADMINISTRATOR")
    assert result.exit_code == 2 and "demote only lowers a role" in one_error_line(result)
    assert {u["user_name"]: u["role"] for u in listed(cli)}["bob"] == "ADMINISTRATOR"  # untouched
    result = cli("user", "promote", "bob", "--to", "ADMINISTRATOR")  # already there: nothing to do
    assert result.exit_code == 0 and "bob is already ADMINISTRATOR" in result.stderr
    assert cli("user", "demote", "bob").exit_code == 0
    assert {u["user_name"]: u["role"] for u in listed(cli)}["bob"] == "USER"


def test_unknown_role_wording(cli):
    create(cli, "root", "SUPER_ADMINISTRATOR")
    result = cli("user", "set-role", "root", "KING")
    assert one_error_line(result) == (
        "error: unknown role 'KING'; one of USER, ADMINISTRATOR, SUPER_ADMINISTRATOR")


def test_role_change_ends_the_users_sessions(cli, env):
    create(cli, "root", "SUPER_ADMINISTRATOR")
    create(cli, "alice")

    async def login(core):
        return await auth.login(core, user_name="alice", password=PASSWORD)

    store(env, login)
    assert cli("user", "set-role", "alice", "ADMINISTRATOR").exit_code == 0
    rows = store(env, lambda core: core.db.list(RefreshToken.select()))
    assert rows and all(r.revoked for r in rows)


def test_last_super_administrator_refusal(cli):
    create(cli, "root", "SUPER_ADMINISTRATOR")
    for args in (("user", "demote", "root"), ("user", "set-role", "root", "USER"),
                 ("user", "delete", "root", "--yes")):
        result = cli(*args)
        assert result.exit_code == 4, result.output
        assert "last SUPER_ADMINISTRATOR" in one_error_line(result)
    assert listed(cli)[0]["role"] == "SUPER_ADMINISTRATOR"


def test_passwd_changes_the_hash_and_ends_sessions(cli, env):
    create(cli, "alice")
    before = store(env, lambda core: User.aget(User.user_name_key == "alice")).password_hash
    result = cli("user", "passwd", "alice", "--password-stdin", input="brand-new-password\n")
    assert result.exit_code == 0, result.output
    after = store(env, lambda core: User.aget(User.user_name_key == "alice")).password_hash
    assert after != before and after.startswith("$argon2id$")

    async def check(core):
        await auth.login(core, user_name="alice", password="brand-new-password")

    store(env, check)
    result = cli("user", "passwd", "alice", "--password-stdin", input="short\n")
    assert result.exit_code == 2 and "password" in one_error_line(result)


def test_delete(cli):
    create(cli, "root", "SUPER_ADMINISTRATOR")
    create(cli, "alice")
    result = cli("user", "delete", "alice")  # no terminal and no --yes: refused
    assert result.exit_code == 2 and "--yes" in one_error_line(result)
    result = cli("user", "delete", "alice", "--yes")
    assert result.exit_code == 0 and "deleted alice" in result.stderr
    assert [u["user_name"] for u in listed(cli)] == ["root"]


@pytest.mark.parametrize(
    "args",
    [("user", "promote", "ghost"), ("user", "demote", "ghost"), ("user", "set-role", "ghost", "USER"),
     ("user", "delete", "ghost", "--yes"), ("user", "passwd", "ghost", "--password-stdin")],
)
def test_unknown_user(cli, args):
    result = cli(*args, input=PASSWORD + "\n")
    assert result.exit_code == 3, result.output
    assert "ghost" in one_error_line(result)


def test_a_real_process_exits_non_zero_with_one_readable_line(env):
    run_env = {**{k: v for k, v in __import__("os").environ.items() if not k.startswith("ORCHESTRA_")}, **env}

    def orchestra(*args, input=None):
        return subprocess.run([sys.executable, "-m", "orchestra", *args], env=run_env, input=input,
                              capture_output=True, text=True, timeout=60)

    done = orchestra("user", "create", "root", "--role", "SUPER_ADMINISTRATOR", "--password-stdin",
                     input=PASSWORD + "\n")
    assert done.returncode == 0, done.stderr
    done = orchestra("user", "delete", "root", "--yes")
    assert done.returncode == 4
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "last SUPER_ADMINISTRATOR" in lines[0]
    done = orchestra("user", "list", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)[0]["user_name"] == "root"
