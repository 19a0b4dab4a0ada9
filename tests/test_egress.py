"""The egress module itself (orchestra/egress.py) with a real loopback HTTP server: the
address classes it refuses, what an allowance means, and pinning — the connection goes
to the address that was checked, looked up once per new connection (a second lookup
answering something else, as DNS rebinding would, is never used), the Host header,
TLS SNI and the certificate check keeping the name. The resolver is the event loop's own, answering as a rebinding DNS
server would."""

from __future__ import annotations

import asyncio
import ipaddress
import socket

import httpx2
import pytest

from orchestra.egress import EgressPolicy, classify
from orchestra.tls import client_tls


@pytest.mark.parametrize(("address", "kind"), [
    ("127.0.0.1", "loopback"), ("127.8.9.10", "loopback"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"),
    ("10.1.2.3", "private"), ("172.16.0.1", "private"), ("192.168.0.1", "private"),
    ("100.64.0.1", "shared (CGNAT)"), ("169.254.169.254", "link-local"), ("fe80::1", "link-local"),
    ("fc00::1", "unique-local"), ("fd12::1", "unique-local"), ("0.0.0.0", "unspecified"), ("::", "unspecified"),
    ("224.0.0.1", "multicast"), ("ff02::1", "multicast"), ("240.0.0.1", "reserved"), ("192.0.2.1", "reserved"),
    ("64:ff9b::7f00:1", "loopback IPv4 address inside an IPv6"), ("::ffff:10.0.0.1", "private"),
    ("8.8.8.8", None), ("2606:4700::1111", None), ("64:ff9b::808:808", None),
])
def test_address_classes(address, kind):
    assert classify(ipaddress.ip_address(address)) == kind


def test_an_allowance_with_a_port_allows_that_port_only():
    policy = EgressPolicy.parse("127.0.0.1:8080,10.0.0.0/8,[::1]:9000,model.internal")
    loop, ten, v6 = ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("10.9.9.9"), ipaddress.ip_address("::1")
    assert policy.refusal("127.0.0.1", 8080, loop) is None
    assert "ORCHESTRA_EGRESS_ALLOW" in policy.refusal("127.0.0.1", 8081, loop)
    assert policy.refusal("127.0.0.2", 8080, ipaddress.ip_address("127.0.0.2")) is not None  # exactly that address
    assert policy.refusal("10.9.9.9", 1, ten) is None and policy.refusal("::1", 9000, v6) is None
    assert policy.refusal("model.internal", 1, loop) is None and policy.refusal("other.internal", 1, loop)
    assert policy.refusal("::ffff:127.0.0.1", 8080, ipaddress.ip_address("::ffff:127.0.0.1")) is None


class Recorder:
    """A loopback HTTP server that answers 200 and records each request's Host header."""

    def __init__(self) -> None:
        self.hosts: list[str] = []
        self.connections = 0

    async def __aenter__(self) -> Recorder:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode()
                self.hosts += [line.split(":", 1)[1].strip() for line in head.split("\r\n")
                               if line.lower().startswith("host:")]
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def rebinding(monkeypatch, answers: list[str]) -> list[str]:
    """The loop's resolver answers `rebind.test` with `answers` one lookup after another
    (then the last again); returns the list of names looked up."""
    loop = asyncio.get_running_loop()
    real, asked = loop.getaddrinfo, []

    async def getaddrinfo(host, port, *args, **kwargs):
        if host != "rebind.test":
            return await real(host, port, *args, **kwargs)
        address = answers[min(len(asked), len(answers) - 1)]
        asked.append(host)
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        return [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))]

    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)
    return asked


async def test_the_connection_goes_to_the_checked_address(monkeypatch):
    """Looked up once: an allowed answer, then any later lookup would answer an address
    where nothing listens. The request reaches the checked address, with Host kept; a
    second request reuses the pooled connection without a lookup."""
    async with Recorder() as server:
        asked = rebinding(monkeypatch, ["127.0.0.1", "127.0.0.3"])
        policy = EgressPolicy.parse(f"127.0.0.1:{server.port}")
        async with httpx2.AsyncClient(transport=policy.transport(verify=client_tls())) as client:
            for _ in range(2):
                response = await client.get(f"http://rebind.test:{server.port}/models")
                assert response.status_code == 200 and response.text == "ok"
        assert len(asked) == 1 and server.connections == 1
        assert server.hosts == [f"rebind.test:{server.port}"] * 2


async def test_a_refused_first_answer_is_not_looked_up_again(monkeypatch):
    async with Recorder() as server:
        asked = rebinding(monkeypatch, ["10.0.0.1", "127.0.0.1"])
        policy = EgressPolicy.parse(f"127.0.0.1:{server.port}")
        async with httpx2.AsyncClient(transport=policy.transport(verify=client_tls())) as client:
            with pytest.raises(httpx2.ConnectError, match="egress rule refuses rebind.test.*10.0.0.1, a private"):
                await client.get(f"http://rebind.test:{server.port}/")
        assert len(asked) == 1 and server.connections == 0


async def test_of_several_answers_only_an_allowed_one_is_used(monkeypatch):
    async with Recorder() as server:
        loop = asyncio.get_running_loop()
        real = loop.getaddrinfo

        async def two(host, port, *args, **kwargs):
            if host != "rebind.test":
                return await real(host, port, *args, **kwargs)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in ("10.0.0.1", "127.0.0.1")]

        monkeypatch.setattr(loop, "getaddrinfo", two)
        policy = EgressPolicy.parse(f"127.0.0.1:{server.port}")
        async with httpx2.AsyncClient(transport=policy.transport(verify=client_tls()), timeout=2) as client:
            assert (await client.get(f"http://rebind.test:{server.port}/")).status_code == 200


def _certificate(tmp_path, name: str) -> tuple[str, str]:
    """A self-signed certificate for `name` only (no IP address in it): (cert, key) paths."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


async def test_tls_is_checked_against_the_name_not_the_address(monkeypatch, tmp_path):
    """The connection goes to the checked address, while TLS sends the name (SNI) and
    verifies the certificate against it: a certificate for the name alone is accepted,
    and the server sees the name as SNI."""
    import ssl

    cert, key = _certificate(tmp_path, "rebind.test")
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    names: list[str | None] = []
    server_tls.sni_callback = lambda sock, name, ctx: names.append(name)
    client_tls_ctx = ssl.create_default_context(cafile=cert)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_tls)
    port = server.sockets[0].getsockname()[1]
    try:
        rebinding(monkeypatch, ["127.0.0.1", "127.0.0.3"])
        policy = EgressPolicy.parse(f"127.0.0.1:{port}")
        async with httpx2.AsyncClient(transport=policy.transport(verify=client_tls_ctx)) as client:
            response = await client.get(f"https://rebind.test:{port}/")
        assert response.status_code == 200 and names == ["rebind.test"]
    finally:
        server.close()
        await server.wait_closed()
