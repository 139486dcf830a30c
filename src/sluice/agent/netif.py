"""The IPv4 address of the node's chosen network interface (setting `net_interface`).

gloo and NCCL are told the interface by name (`GLOO_SOCKET_IFNAME`), but Ray is told an
address (`--node-ip-address`), and the address a Ray node advertises is also the
`MASTER_ADDR` every gang's replicas rendezvous at. So sluice needs the interface's address,
read from the kernel through psutil (never by running a command through a shell), and a
clear reason when there is none: a Ray node bound to an address this machine does not have
would not start, and one left unbound would quietly use whatever interface the host name
resolves to — the very traffic `net_interface` is meant to move.
"""

from __future__ import annotations

import socket

import psutil

NET_IP_LABEL = "net-interface-ip"
"""Node label (Ray engine): the `net_interface` address on that node, or "none"."""


class NetInterfaceUnavailable(RuntimeError):
    """The configured interface cannot carry Ray's traffic here; the message says why."""


def interface_ipv4(name: str) -> str:
    """The interface's first IPv4 address (its primary one), or NetInterfaceUnavailable.

    Refused, with the reason: no such interface on this machine, an interface that is down,
    and one without an IPv4 address.
    """
    addrs = psutil.net_if_addrs()
    if name not in addrs:
        have = ", ".join(sorted(addrs)) or "none"
        raise NetInterfaceUnavailable(
            f"net_interface {name!r}: no such network interface on this machine (it has: {have})"
        )
    stats = psutil.net_if_stats().get(name)
    if stats is not None and not stats.isup:
        raise NetInterfaceUnavailable(f"net_interface {name!r}: the interface is down (`ip link set {name} up`)")
    v4 = [a.address for a in addrs[name] if a.family == socket.AF_INET]
    if not v4:
        raise NetInterfaceUnavailable(
            f"net_interface {name!r}: the interface has no IPv4 address, so Ray cannot be bound to it "
            "(Ray's --node-ip-address takes an address, not an interface)"
        )
    return v4[0]


def interface_ipv4_or_none(name: str) -> str:
    """interface_ipv4 for a node label: "none" where the node has no usable address."""
    try:
        return interface_ipv4(name)
    except NetInterfaceUnavailable:
        return "none"
