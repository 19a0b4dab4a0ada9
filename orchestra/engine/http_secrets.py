"""Secrets on the wire (SPEC §15b): an HTTP step's `{{ secrets.NAME }}` goes only on a
request to one of that secret's hosts, redirects included.

A `SecretGuard` rides on the step's request (an httpx2 request extension, which a
redirect's request inherits) and the client's request hook asks it before each request
of the exchange is sent, so before any byte of it leaves:
- the first request: every secret the step names must allow its host and port
  (orchestra/secret_hosts.py), else the step fails naming the secret and the host; a
  name no secret has fails the same way, with the same sentence;
- each redirect: a header that carries a secret value is dropped when the redirect goes
  to another host or to a host:port the secret does not allow; a URL that carries one
  (as it is or percent-encoded) there fails the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx2

from orchestra import redaction, secret_hosts

EXTENSION = "orchestra.secret_guard"


class SecretRefused(Exception):
    """A request would carry a secret where it may not go; `message` names both."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class SecretGuard:
    values: dict[str, str]  # name -> value (*** for a name no secret has: never sent)
    hosts: dict[str, list[str] | None]  # name -> its hosts (None: none set, or no such secret)
    first: tuple[str, int] | None = field(default=None)

    def check(self, request: httpx2.Request) -> None:
        """Before `request` is sent: SecretRefused, or headers dropped (see the module)."""
        host, port = secret_hosts.destination(request.url)
        if self.first is None:
            self.first = (host, port)
            for name in sorted(self.values):
                if not secret_hosts.allows(self.hosts.get(name), host, port):
                    raise SecretRefused(secret_hosts.refusal(name, host, port))
            return
        other_host = host != self.first[0]
        url = str(request.url)
        for name, value in sorted(self.values.items()):
            if value == redaction.MASK:
                continue
            allowed = secret_hosts.allows(self.hosts.get(name), host, port)
            if not allowed and redaction.contains(url, value):
                raise SecretRefused(secret_hosts.refusal(name, host, port) + " (after a redirect)")
            if allowed and not other_host:
                continue
            for key in {k for k, v in request.headers.multi_items() if value in v}:
                del request.headers[key]


async def check_request(request: httpx2.Request) -> None:
    """httpx2's request hook: the guard of the request, if it carries one."""
    guard = request.extensions.get(EXTENSION)
    if guard is not None:
        guard.check(request)
