"""What a stdio MCP server may run (SPEC §9): a bare command name the operator listed in
ORCHESTRA_MCP_STDIO_COMMANDS, found on the server's own PATH, started with only PATH,
HOME and its own `env`, whose names no runtime or library interprets.

The same checks run when a server is saved and again at every start of its process, so
a stored server that the rules (or the setting) no longer allow does not start.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any

STDIO_SETTING = "ORCHESTRA_MCP_STDIO_COMMANDS"
STDIO_INHERITED = ("PATH", "HOME")  # all a stdio server gets from us, besides its own env

# A bare command name: no directory part, no leading "-" or ".".
COMMAND_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]{0,127}$")

# The env rule: a name is accepted when it matches ENV_NAME and is none of ENV_DENIED,
# begins with none of ENV_DENIED_PREFIXES and ends with none of ENV_DENIED_SUFFIXES.
ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]{0,127}$")
ENV_DENIED = frozenset({
    "HOME", "BROWSER", "EDITOR", "VISUAL", "PAGER", "SHELL", "ENV", "BASH_ENV", "IFS",
    "PS1", "PS2", "PS3", "PS4", "PROMPT_COMMAND", "SHELLOPTS", "BASHOPTS", "GLOBIGNORE",
    "ZDOTDIR", "HISTFILE", "TMPDIR", "TMP", "TEMP", "TZDIR", "TERMINFO", "TERMCAP",
    "HOSTALIASES", "LOCALDOMAIN", "RES_OPTIONS", "NETRC", "REQUESTS_CA_BUNDLE",
    "VIRTUAL_ENV", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH",
    "GOFLAGS", "GOROOT", "GOTOOLCHAIN", "GOPROXY", "GOENV", "GODEBUG", "GOEXPERIMENT",
    "GONOSUMDB", "GOPRIVATE", "GOINSECURE", "GOCACHE", "GOMODCACHE", "GOBIN",
})
ENV_DENIED_PREFIXES = (
    "LD_", "DYLD_", "GLIBC_", "MALLOC_", "GCONV", "LOCPATH", "NLSPATH",
    "PYTHON", "PYTEST_", "IPYTHON", "JUPYTER_", "COVERAGE_", "PIP_", "UV_", "CONDA_",
    "NODE_", "NPM_", "YARN_", "BUN_", "DENO_", "ELECTRON_",
    "PERL", "RUBY", "GEM_", "BUNDLE_", "PHP", "LUA_", "TCL", "R_PROFILE", "R_ENVIRON",
    "JAVA_", "JDK_", "MAVEN_", "GRADLE_", "DOTNET_", "CORECLR_", "COREHOST_", "COMPLUS_",
    "GIT_", "SSH_", "SUDO_", "SSL_", "OPENSSL_", "CURL_", "KRB5", "GRPC_",
    "QT_", "GTK_", "GDK_", "GIO_", "GST_", "GI_", "PKG_CONFIG", "XDG_", "DBUS_", "LESS",
)
ENV_DENIED_SUFFIXES = ("PATH", "_HOME", "_OPTIONS", "_OPTS", "FLAGS", "_PROXY", "_PRELOAD", "RC")
# The whole rule as one ECMA-262 pattern (the OpenAPI document publishes it).
ENV_NAME_PATTERN = (
    "^(?!(?:" + "|".join(sorted(ENV_DENIED)) + ")$)"
    "(?!(?:" + "|".join(ENV_DENIED_PREFIXES) + "))"
    "(?!.*(?:" + "|".join(ENV_DENIED_SUFFIXES) + ")$)"
    "[A-Z][A-Z0-9_]{0,127}$"
)
COMMAND_PATTERN = r"^\s*[A-Za-z0-9_][A-Za-z0-9._+-]{0,127}\s*$"


def command_problem(command: str) -> str | None:
    """Why `command` is not a bare command name (a path, say), or None."""
    if COMMAND_NAME.match(command):
        return None
    return ("must be a bare command name without a directory (it is looked up on the "
            f"server's own PATH), e.g. 'mcp-server-time'; got {command[:80]!r}")


def command_refusal(command: str, allowed: frozenset[str]) -> str | None:
    """Why ORCHESTRA_MCP_STDIO_COMMANDS does not let `command` run, or None."""
    if command in allowed:
        return None
    listed = ", ".join(sorted(allowed)) or "nothing"
    return f"The command '{command}' is not allowed for stdio MCP servers: {STDIO_SETTING} lists {listed}."


def env_refusal(name: str) -> str | None:
    """Why `name` may not be set in a stdio server's env, or None when it may."""
    if not ENV_NAME.match(name):
        return "must be upper-case letters, digits and '_', beginning with a letter"
    if name in ENV_DENIED or name.startswith(ENV_DENIED_PREFIXES) or name.endswith(ENV_DENIED_SUFFIXES):
        return ("is interpreted by a runtime, the shell or a library (it could change what the "
                "process runs); such names are refused, see the env rule in docs/api.md")
    return None


def resolve_command(command: str) -> str | None:
    """The absolute path of `command` on the server's own PATH (never the child's)."""
    return shutil.which(command, path=os.environ.get("PATH", os.defpath))


def launch(command: str, args: tuple[str, ...], env: dict[str, str], allowed: frozenset[str]) -> tuple[str, list[str], dict[str, str]]:
    """`(program, argv, environment)` to start a stdio server, every rule checked again;
    ValueError with the reason otherwise. The SDK adds a few variables of ours (LOGNAME,
    SHELL, TERM, USER) to every child; `env -u` takes them away again, so the server
    sees only PATH, HOME and its own env (no secret value appears on a command line)."""
    from mcp.client.stdio import DEFAULT_INHERITED_ENV_VARS

    problem = command_problem(command)
    if problem:
        raise ValueError(f"command {problem}")
    refused = command_refusal(command, allowed)
    if refused:
        raise ValueError(refused)
    for name in env:
        problem = env_refusal(name)
        if problem:
            raise ValueError(f"env.{name} {problem}")
    program = resolve_command(command)
    if program is None:
        raise ValueError(f"The command '{command}' was not found on the server's PATH.")
    child = {k: os.environ[k] for k in STDIO_INHERITED if k in os.environ}
    child.update(env)
    unset = [name for name in DEFAULT_INHERITED_ENV_VARS if name not in child]
    env_tool = shutil.which("env", path=os.defpath) or "/usr/bin/env"
    return env_tool, [f"-u{name}" for name in unset] + ["--", program, *args], child


def stdio_parameters(config: Any, allowed: frozenset[str]) -> Any:
    """The SDK's spawn parameters for a server's config (see `launch`)."""
    from mcp.client.stdio import StdioServerParameters

    program, argv, env = launch(config.command or "", tuple(config.args), dict(config.env), allowed)
    return StdioServerParameters(command=program, args=argv, env=env)
