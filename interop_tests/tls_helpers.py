"""A test CA, certificates it signs, and a broker with TLS listeners, for the TLS interop tests.

`trustme` makes the CA and certificates in memory; `TlsFiles` writes them where the broker's
`[tls]` settings and the clients can read them.
"""

from __future__ import annotations

import asyncio
import datetime
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aio_pika
import trustme

from interop_tests.broker_process import BrokerProcess, free_port


@dataclass
class TlsFiles:
    ca: trustme.CA
    directory: Path

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def cert_file(self) -> Path:
        return self.directory / "server-cert.pem"

    @property
    def key_file(self) -> Path:
        return self.directory / "server-key.pem"

    def issue_server_cert(self, **kwargs: object) -> trustme.LeafCert:
        """(Re)write the broker's certificate and key, for 127.0.0.1 and localhost."""
        leaf = self.ca.issue_cert("127.0.0.1", "localhost", **kwargs)
        leaf.cert_chain_pems[0].write_to_path(str(self.cert_file))
        leaf.private_key_pem.write_to_path(str(self.key_file))
        return leaf

    def client_cert(self, common_name: str) -> Path:
        """A client certificate (and its key, in one PEM file) whose CN is `common_name`."""
        leaf = self.ca.issue_cert(f"{common_name}@example.com", common_name=common_name)
        path = self.directory / f"client-{common_name}.pem"
        leaf.private_key_and_cert_chain_pem.write_to_path(str(path))
        return path

    def client_context(self, client_cert: Path | None = None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if client_cert is not None:
            context.load_cert_chain(str(client_cert))
        return context


# The broker's certificate expires this long after it is made (the certificate-expiration check).
SERVER_CERT_LIFETIME = datetime.timedelta(days=60)


def make_tls_files(directory: Path) -> TlsFiles:
    directory.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(trustme.CA(organization_name="amqp-server tests"), directory)
    files.ca.cert_pem.write_to_path(str(files.ca_file))
    files.issue_server_cert(not_after=datetime.datetime.now(datetime.timezone.utc) + SERVER_CERT_LIFETIME)
    return files


def tls_config(files: TlsFiles, base_config: str, extra: str = "") -> str:
    """`base_config` with a [tls] section naming `files`; `extra` adds [tls] keys."""
    return base_config + f"""
[tls]
certfile = "{files.cert_file}"
keyfile = "{files.key_file}"
cacertfile = "{files.ca_file}"
{extra}
"""


def tls_ports() -> dict[str, int]:
    return {"amqps": free_port(), "https": free_port(), "metrics_https": free_port()}


def tls_args(ports: dict[str, int]) -> tuple[str, ...]:
    return ("--ssl-port", str(ports["amqps"]), "--management-ssl-port", str(ports["https"]),
            "--metrics-ssl-port", str(ports["metrics_https"]))


def amqps_url(broker: BrokerProcess, port: int, user: str = "guest", password: str = "guest") -> str:
    return f"amqps://{user}:{password}@localhost:{port}/%2F"


def aio_pika_round_trip(connect: "Callable[[], Awaitable[aio_pika.abc.AbstractRobustConnection]]", body: bytes) -> bytes:
    """Connect with aio-pika, publish `body` to a fresh queue and get it back."""
    async def scenario() -> bytes:
        async with await connect() as connection:
            channel = await connection.channel()
            queue = await channel.declare_queue("", exclusive=True)
            await channel.default_exchange.publish(aio_pika.Message(body), routing_key=queue.name)
            message = await queue.get(timeout=5)
            await message.ack()
            return message.body

    return asyncio.run(scenario())
