"""The egress rule (SPEC §14, §15b): where outgoing connections may go.

Two rules with one shape: the operator's destinations (model providers, MCP servers)
obey `ORCHESTRA_EGRESS_ALLOW`; the users' destinations (HTTP steps, outbound
subscriptions) obey `ORCHESTRA_STEP_EGRESS_ALLOW`, so a loopback model server opened
for providers is not open to every user's HTTP step. A policy carries the name of its
setting, which every refusal names.

A host is resolved once per new connection; every address it resolves to is checked,
and the connection is made to an address that passed (never to a second lookup of the
name, so DNS rebinding cannot swap the address afterwards). Addresses that are not
globally routable are refused — loopback, private, shared (CGNAT), link-local (cloud
metadata included), unique-local, unspecified, multicast, reserved and documentation
ranges, and IPv4 addresses written inside IPv6 forms — unless `ORCHESTRA_EGRESS_ALLOW`
lists them. Odd spellings (`127.1`, `2130706433`, `0x7f.1`) need no rule of their own:
they are checked as the address they resolve to.

`ORCHESTRA_EGRESS_ALLOW` is comma-separated; each entry is a CIDR (`10.0.0.0/8`), an
address (exactly that address: `127.0.0.1`, `::1`) or a host name (`ollama.internal`:
that name, whatever it resolves to), optionally with `:port` (IPv6 in brackets:
`[::1]:11434`, `[fd00::/8]:443`), which then allows that port only.

httpx2 clients get this through `egress_transport()`: an httpcore2 network backend
whose `connect_tcp` resolves, checks and connects to the chosen address, while TLS (SNI
and the certificate check) and the Host header keep using the name. Pooled connections
are reused without a new lookup; each new connection (a redirect's too) is checked.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import re
import socket
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpcore2
import httpx2

SETTING = "ORCHESTRA_EGRESS_ALLOW"
STEP_SETTING = "ORCHESTRA_STEP_EGRESS_ALLOW"
SAVE_RESOLVE_SECONDS = 3.0  # a save-time lookup that takes longer is not held against the URL

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_SHARED = ipaddress.ip_network("100.64.0.0/10")
_PRIVATE_V4 = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
_UNIQUE_LOCAL = ipaddress.ip_network("fc00::/7")
_HOST_NAME = re.compile(r"^(?=.*[a-z_-])[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?)*$")


class EgressRefused(httpcore2.ConnectError):
    """A connection the egress rule does not allow; the message names the rule, the
    address and the setting. A ConnectError, so HTTP clients report it as one."""


@dataclass(frozen=True)
class AllowEntry:
    """One entry of ORCHESTRA_EGRESS_ALLOW: a network or a host name, maybe one port."""

    network: IPNetwork | None = None
    host: str | None = None
    port: int | None = None

    def allows(self, host: str, address: IPAddress | None, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.host is not None:
            return self.host == host
        return address is not None and self.network is not None and address in self.network


def _unwrap(address: IPAddress) -> IPAddress:
    """The IPv4 address inside an IPv4-mapped (`::ffff:a.b.c.d`) IPv6 address."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def classify(address: IPAddress) -> str | None:
    """Why `address` is refused by default ("loopback", "private", …), or None when it
    is a globally routable address."""
    address = _unwrap(address)
    if address.is_loopback:
        return "loopback"
    if address.is_unspecified:
        return "unspecified"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if isinstance(address, ipaddress.IPv4Address):
        return _classify_v4(address)
    return _classify_v6(address)


def _classify_v4(address: ipaddress.IPv4Address) -> str | None:
    if address in _SHARED:
        return "shared (CGNAT)"
    if any(address in net for net in _PRIVATE_V4):
        return "private"
    if address.is_reserved or address.is_private or not address.is_global:
        return "reserved"
    return None


def _classify_v6(address: ipaddress.IPv6Address) -> str | None:
    if address in _UNIQUE_LOCAL:
        return "unique-local"
    if address.is_site_local:
        return "site-local"
    embedded = _embedded_v4(address)
    if embedded is not None:  # NAT64 (DNS64 on IPv6-only hosts), 6to4, Teredo: as the IPv4
        inner = classify(embedded)
        return None if inner is None else f"{inner} IPv4 address inside an IPv6"
    if address.is_reserved or address.is_private or not address.is_global:
        return "reserved"
    return None


def _embedded_v4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (NAT64, IPv4-compatible, 6to4, Teredo), if any."""
    if address in _NAT64 or address in _IPV4_COMPATIBLE:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    return None


def _parse_entry(text: str, setting: str = SETTING) -> AllowEntry:
    target, port = text, None
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or (text[end + 1:] and not text[end + 1:].startswith(":")):
            raise ValueError(f"{setting}: {text!r} is not [IPv6 address or network] or [...]:port")
        target, rest = text[1:end], text[end + 2:]
        port = rest or None
    elif text.count(":") == 1:
        target, port = text.split(":")
    number = None
    if port is not None:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{setting}: the port of {text!r} must be a number from 1 to 65535")
        number = int(port)
    try:
        network = ipaddress.ip_network(target, strict=False)
    except ValueError:
        name = target.lower().rstrip(".")
        if not _HOST_NAME.match(name):
            raise ValueError(
                f"{setting}: {text!r} is neither an address, a CIDR network nor a host name "
                "(write IPv4 addresses in dotted form, IPv6 ones in brackets when a port follows)"
            ) from None
        return AllowEntry(host=name, port=number)
    if isinstance(network, ipaddress.IPv6Network) and network.prefixlen >= 96:
        mapped = network.network_address.ipv4_mapped
        if mapped is not None:  # ::ffff:a.b.c.d/n means the IPv4 network
            network = ipaddress.ip_network(f"{mapped}/{max(network.prefixlen - 96, 0)}", strict=False)
    return AllowEntry(network=network, port=number)


def _literal(host: str) -> IPAddress | None:
    try:
        return _unwrap(ipaddress.ip_address(host.strip("[]").split("%")[0]))
    except ValueError:
        return None


@dataclass(frozen=True)
class EgressPolicy:
    """The egress rule with its allowances; build with `EgressPolicy.parse(setting)`."""

    entries: tuple[AllowEntry, ...] = ()
    setting: str = SETTING  # the setting that opens addresses, named by every refusal

    @classmethod
    def parse(cls, text: str, setting: str = SETTING) -> EgressPolicy:
        """The setting's value; ValueError naming the setting for a bad entry."""
        return _parse(text or "", setting)

    def refusal(self, host: str, port: int, address: IPAddress | None) -> str | None:
        """Why a connection to `address` (resolved from `host`) on `port` is refused, or
        None when the rule allows it."""
        name = host.lower().rstrip(".")
        if address is not None:
            address = _unwrap(address)
        if any(entry.allows(name, address, port) for entry in self.entries):
            return None
        if address is None:
            return f"The egress rule refuses {host}: it has no address."
        kind = classify(address)
        if kind is None:
            return None
        shown = f"[{address}]" if address.version == 6 else str(address)
        where = f"[{host}]" if ":" in host else host
        through = "" if _literal(host) == address else f"{host} resolves to {address}, "
        article = "an" if kind[0] in "aeiou" else "a"
        return (f"The egress rule refuses {where}:{port}: {through}{article} {kind} address. "
                f"An operator may allow it with {self.setting} (e.g. {self.setting}={shown}:{port}).")

    async def resolve(self, host: str, port: int) -> list[str]:
        """The addresses of `host` this rule allows, in resolver order; EgressRefused when
        there are none (OSError when the name does not resolve)."""
        literal = _literal(host)
        if literal is not None:
            addresses = [literal]
        else:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
            addresses = []
            for info in infos:
                found = ipaddress.ip_address(str(info[4][0]).split("%")[0])
                if found not in addresses:
                    addresses.append(found)
        allowed = [a for a in addresses if self.refusal(host, port, a) is None]
        if not allowed:
            raise EgressRefused(self.refusal(host, port, addresses[0] if addresses else None) or "")
        return [str(_unwrap(a)) if _unwrap(a).version == 4 else str(a) for a in allowed]

    async def url_refusal(self, url: str) -> str | None:
        """At save: why the rule refuses `url`'s host, or None. A name that does not
        resolve now (or not within SAVE_RESOLVE_SECONDS) is not refused here; every
        connection is checked again anyway."""
        try:
            parts = urlsplit(url)
            host, port = parts.hostname, parts.port
        except ValueError:
            return None
        if not host:
            return None
        port = port or (443 if parts.scheme == "https" else 80)
        try:
            async with asyncio.timeout(SAVE_RESOLVE_SECONDS):
                await self.resolve(host, port)
        except EgressRefused as refused:
            return str(refused)
        except (OSError, TimeoutError, UnicodeError):
            return None
        return None

    def transport(self, *, verify: ssl.SSLContext, limits: httpx2.Limits | None = None) -> EgressTransport:
        """An httpx2 transport whose every new connection obeys this rule."""
        return EgressTransport(self, verify=verify, limits=limits or httpx2.Limits())


#: The rule with nothing allowed (ORCHESTRA_EGRESS_ALLOW empty): public addresses only.
PUBLIC_ONLY = EgressPolicy()
#: The users' rule with nothing allowed (ORCHESTRA_STEP_EGRESS_ALLOW empty).
STEP_PUBLIC_ONLY = EgressPolicy(setting=STEP_SETTING)


@functools.cache
def _parse(text: str, setting: str = SETTING) -> EgressPolicy:
    entries = tuple(_parse_entry(part.strip(), setting) for part in text.split(",") if part.strip())
    return EgressPolicy(entries, setting)


class EgressBackend(httpcore2.AsyncNetworkBackend):
    """httpcore2's network backend with the egress rule: resolve once, check, connect
    to the checked address (TLS is then started by httpcore2 with the host name)."""

    def __init__(self, policy: EgressPolicy) -> None:
        self.policy = policy
        self._inner = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self, host: str, port: int, timeout: float | None = None,
        local_address: str | None = None, socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                addresses = await self.policy.resolve(host, port)
        except TimeoutError:
            raise httpcore2.ConnectTimeout(f"Looking up {host} took longer than {timeout:g} s.") from None
        except OSError as exc:
            raise httpcore2.ConnectError(f"The host name {host} could not be resolved ({exc.strerror or exc}).") from None
        last: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address,
                    socket_options=socket_options)
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                last = exc
        assert last is not None
        raise last

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None) -> httpcore2.AsyncNetworkStream:
        raise EgressRefused("The egress rule allows TCP connections only.")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class EgressTransport(httpx2.AsyncHTTPTransport):
    """httpx2's transport over a pool whose connections go through EgressBackend; no
    proxy from the environment (a proxy would make the lookup that the rule checks)."""

    def __init__(self, policy: EgressPolicy, *, verify: ssl.SSLContext, limits: httpx2.Limits) -> None:
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=verify,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=EgressBackend(policy),
        )


def find_refusal(exc: BaseException | None) -> EgressRefused | None:
    """The EgressRefused behind `exc` (through causes, contexts and exception groups)."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, EgressRefused):
            return current
        if isinstance(current, BaseExceptionGroup):
            stack.extend(current.exceptions)
        stack.extend((current.__cause__, current.__context__))
    return None
