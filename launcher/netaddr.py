"""This host's addresses as the ranks of a job that spans hosts need them (Linux, IPv4).

- ``address_of(host)``: a host name (or address) of a host file resolved to its IPv4
  address, as every host resolves it;
- ``interface_of(addr)``: the name of this host's network interface that holds ``addr``
  (gloo's ``GLOO_SOCKET_IFNAME``, NCCL's ``NCCL_SOCKET_IFNAME``: without them both take
  the address this host's own name resolves to, often 127.0.0.1 or 127.0.1.1);
- ``source_address(peer)``: the address this host sends from to reach ``peer`` (what
  Hydra's ``mpiexec -localhost`` gives its proxies to connect back to).

Nothing is sent: ``source_address`` only asks the kernel for the route (a UDP socket's
``connect``).
"""
from __future__ import annotations

import fcntl
import socket
import struct

from instances.errors import InputError

SIOCGIFADDR = 0x8915             # Linux ioctl: an interface's IPv4 address


def address_of(host: str) -> str:
    """``host``'s IPv4 address (an address is returned as it is)."""
    try:
        return socket.gethostbyname(host)
    except OSError as e:
        raise InputError(f"host {host!r} does not resolve to an IPv4 address here ({e})", field="hosts") from None


def interface_addresses() -> dict[str, str]:
    """Interface name -> its IPv4 address, for every interface that has one."""
    out = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:                     # no IPv4 address
                continue
            out[name] = socket.inet_ntoa(raw[20:24])
    return out


def interface_of(addr: str) -> str | None:
    """The interface of this host holding ``addr``; None when no interface here has it."""
    return next((name for name, a in interface_addresses().items() if a == addr), None)


def source_address(peer: str) -> str:
    """The address this host uses to reach ``peer`` (a host name or address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((address_of(peer), 9))
        except OSError as e:
            raise InputError(f"no route from this host to {peer!r} ({e})", field="hosts") from None
        return s.getsockname()[0]
