"""Where a secret may go (SPEC §15b): the `hosts` an administrator stores with it.

An entry is a host name (`api.example.com`), a wildcard (`*.example.com`: any name
below example.com, at any depth, not example.com itself), an IPv4 address or an IPv6
one (in brackets when a port follows: `[::1]:8443`), each with an optional `:port`; an
entry without a port allows any port. Entries are compared with the host as written in
the request's URL (lower case, IDNA-encoded, a trailing dot ignored), never with what it
resolves to: `localhost` and `127.0.0.1` are different hosts, as are `127.1` and
`127.0.0.1`. A secret whose `hosts` is None (stored before hosts existed) or empty
goes nowhere.

`refusal` is the one sentence every refusal uses, at save and at run time, whether the
secret exists or not (so no answer tells a user which secret names exist).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

import httpx2

HOSTS_MAX = 50  # entries per secret
ENTRY_MAX = 260
_LABEL = "[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_PORT = "(?::(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}))"
_V6 = "[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*"
#: An entry, exactly as the OpenAPI document states it (the parser accepts all it matches).
ENTRY_PATTERN = (f"^(?:(?:\\*\\.{_LABEL}(?:\\.{_LABEL})+|{_LABEL}(?:\\.{_LABEL})*|\\[{_V6}\\]){_PORT}?"
                 f"|{_V6})$")
_ENTRY = re.compile(ENTRY_PATTERN)
HOSTS_RULE = (f"must be a list of 1 to {HOSTS_MAX} hosts: host names (api.example.com), wildcards "
              "(*.example.com), IPv4 or [IPv6] addresses, each with an optional :port")


@dataclass(frozen=True)
class HostEntry:
    host: str  # a lower-case name or an address's compressed form; for a wildcard, the domain
    port: int | None = None
    wildcard: bool = False

    def allows(self, host: str, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.wildcard:
            return host.endswith("." + self.host)
        return host == self.host

    def __str__(self) -> str:
        shown = ("*." if self.wildcard else "") + (f"[{self.host}]" if ":" in self.host else self.host)
        return shown if self.port is None else f"{shown}:{self.port}"


def _normal(host: str) -> str:
    """A host as compared: an address's canonical form, else the lower-case text without a
    trailing dot."""
    bare = host.strip("[]")
    try:
        return ipaddress.ip_address(bare).compressed
    except ValueError:
        return bare.lower().rstrip(".")


def parse_entry(text: str) -> HostEntry:
    """One `hosts` entry; ValueError saying what is wrong with it."""
    if not isinstance(text, str) or len(text) > ENTRY_MAX or not _ENTRY.fullmatch(text):
        raise ValueError(f"{str(text)[:80]!r} is not a host name, *.domain, IPv4 or [IPv6] address with an "
                         "optional :port (ASCII; write an international name in its xn-- form)")
    wildcard = text.startswith("*.")
    rest = text[2:] if wildcard else text
    port = None
    if rest.startswith("["):
        end = rest.index("]")
        host, port = rest[1:end], rest[end + 2:] or None
    elif rest.count(":") == 1:
        host, port = rest.split(":")
    else:
        host = rest
    return HostEntry(_normal(host), int(port) if port else None, wildcard)


def clean_hosts(values: object) -> list[str]:
    """The `hosts` of a secret as stored (each entry in its canonical spelling, in the
    order given, without repeats); ValueError naming the first bad entry."""
    if not isinstance(values, list) or not 1 <= len(values) <= HOSTS_MAX:
        raise ValueError(HOSTS_RULE)
    kept: list[str] = []
    for value in values:
        shown = str(parse_entry(value))
        if shown not in kept:
            kept.append(shown)
    return kept


def entries(hosts: Iterable[str] | None) -> tuple[HostEntry, ...]:
    """The stored `hosts` as entries (an entry that no longer parses allows nothing)."""
    found = []
    for text in hosts or ():
        try:
            found.append(parse_entry(text))
        except ValueError:
            continue
    return tuple(found)


def allows(hosts: Iterable[str] | None, host: str, port: int) -> bool:
    """Whether a secret with these `hosts` may be sent to `host` (as written in the URL:
    what `destination` gives) on `port`."""
    normal = _normal(host)
    return any(entry.allows(normal, port) for entry in entries(hosts))


def destination(url: httpx2.URL) -> tuple[str, int]:
    """The host (as written, ASCII, lower case) and port a request to `url` goes to."""
    host = url.raw_host.decode("ascii", "replace")
    port = url.port or (443 if url.scheme == "https" else 80)
    return _normal(host), port


def shown(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def literal_destination(url_template: str) -> tuple[str, int] | None:
    """At save: the host and port of an HTTP step's URL when the template writes them
    literally (no `{{ }}` before the end of the authority), else None (the run checks)."""
    if not isinstance(url_template, str):
        return None
    start = url_template.find("://")
    if start < 0:
        return None
    rest = url_template[start + 3:]
    ends = [i for i in (rest.find(c) for c in "/?#") if i >= 0]
    end = min(ends) if ends else None
    if "{{" in (rest if end is None else rest[:end]):
        return None
    literal = url_template[:start + 3] + (rest if end is None else rest[:end])
    try:
        url = httpx2.URL(literal)
    except (httpx2.InvalidURL, ValueError, TypeError):
        return None
    if url.scheme not in ("http", "https") or not url.raw_host:
        return None
    return destination(url)


def refusal(name: str, host: str, port: int) -> str:
    """Why `{{ secrets.NAME }}` is not sent to host:port: one sentence whether or not
    the secret exists (SPEC §15b: no answer tells which names exist)."""
    return (f"the secret '{name}' may not be sent to {shown(host, port)}: no secret of that name "
            "lists that host in its hosts (an administrator stores secrets and their hosts "
            "under /api/v1/resource/secret)")
