"""Check that `--scheduler ADDRESS` is a Dask scheduler before handing it to Dask, within bounded time.

Dask's client trusts what answers: a server of another protocol makes it read 8 bytes as a message length
(a 3 EiB allocation), and a server that accepts and stays silent holds it for as long as it keeps the
connection. A Dask listener sends its handshake first, unasked (distributed.comm.core.Listener
.on_connection writes `handshake_info()`: compression, python, pickle-protocol, in msgpack), framed by the
TCP comm as an 8-byte little-endian length and the frames (distributed/comm/tcp.py). So: connect within
CONNECT_TIMEOUT_S, read that frame within HANDSHAKE_TIMEOUT_S, check its length and keys, and only then
let Dask connect.
"""

from __future__ import annotations

import socket
import struct
import time

from xsim.traces.errors import XsimError

CONNECT_TIMEOUT_S = 5.0  # a scheduler on a reachable host accepts at once
HANDSHAKE_TIMEOUT_S = 5.0  # and sends its handshake at once (a ~100-byte dict)
MAX_HANDSHAKE_BYTES = 64 << 10  # the handshake dict is ~100 bytes; anything near this is not Dask
_KEYS = (b"compression", b"python", b"pickle-protocol")  # handshake_info()'s keys


class SchedulerError(XsimError):
    """An address that is not a Dask scheduler, or one that does not answer in time."""


def _host_port(address: str) -> tuple[str, int]:
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise SchedulerError(f"--scheduler {address}: not HOST:PORT (e.g. tcp://10.0.0.5:8786)")
    return host.strip("[]"), int(port)


def _read(sock: socket.socket, n: int, deadline: float, address: str) -> bytes:
    buf = b""
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SchedulerError(
                f"--scheduler {address}: connected, but no Dask handshake within {HANDSHAKE_TIMEOUT_S:g} s "
                f"(not a Dask scheduler?)"
            )
        sock.settimeout(left)
        try:
            chunk = sock.recv(n - len(buf))
        except TimeoutError:
            continue
        if not chunk:
            raise SchedulerError(f"--scheduler {address}: closed the connection before a Dask handshake")
        buf += chunk
    return buf


def probe_scheduler(address: str) -> None:
    """Refuse in one line an address that is not a Dask scheduler answering within the timeouts."""
    scheme = address.split("://", 1)[0].lower() if "://" in address else "tcp"
    if scheme == "tls":
        import dask.config

        tls = dask.config.get("distributed.comm.tls", default={}) or {}
        client = tls.get("client", {}) if isinstance(tls, dict) else {}
        if not (tls.get("ca-file") or (isinstance(client, dict) and client.get("cert"))):
            raise SchedulerError(
                f"--scheduler {address}: tls:// needs TLS settings (distributed.comm.tls.ca-file and "
                f"distributed.comm.tls.client.cert/key in the Dask config); none are set"
            )
        return  # the TLS handshake comes first there; Dask's own connect timeout bounds it
    if scheme not in ("tcp", "tls"):
        raise SchedulerError(f"--scheduler {address}: only tcp:// and tls:// schedulers are supported")
    host, port = _host_port(address)
    try:
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError) as exc:
        why = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise SchedulerError(f"--scheduler {address}: cannot connect: {why}") from None
    with sock:
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
        (size,) = struct.unpack("<Q", _read(sock, 8, deadline, address))
        if not 8 <= size <= MAX_HANDSHAKE_BYTES:
            raise SchedulerError(
                f"--scheduler {address}: answered with something other than a Dask handshake (a first "
                f"message of {size} bytes); is it a Dask scheduler port?"
            )
        body = _read(sock, size, deadline, address)
        if not all(k in body for k in _KEYS):
            raise SchedulerError(
                f"--scheduler {address}: answered with something other than a Dask handshake; is it a Dask "
                f"scheduler port?"
            )
