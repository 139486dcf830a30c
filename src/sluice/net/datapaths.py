"""The datapaths: how two pods on two nodes are joined, each built from namespaces.

Topology (every name below lives inside a namespace of the lab; the host sees only the
namespaces):

    pod p0 ──(datapath)── node n0 ══ underlay veth "sl-ul" (the wire, 10.213.0.0/24) ══ node n1 ──(datapath)── pod p1

The client runs in p0 and the server in p1 (for `host`, in n0 and n1). Each datapath is
built in namespaces of its own, measured, and torn down before the next. Pod subnets are
10.213.1.0/24 (node 0) and 10.213.2.0/24 (node 1); the kernel never sees these addresses
outside the lab's namespaces.

| datapath | what it is                                   | CNI it stands for                            |
|----------|----------------------------------------------|----------------------------------------------|
| loopback | both ends in the host namespace, 127.0.0.1   | reference ceiling, not a cross-node path     |
| host     | no pod namespace: the node's own link        | hostNetwork: true                            |
| routed   | veth per pod, node routes pod subnets        | Calico (no encapsulation), Cilium native routing |
| bridge   | veth per pod on a node bridge + routes       | Flannel host-gw, the bridge/ptp CNI plugins  |
| macvlan  | pod gets a macvlan child of the node's link  | macvlan CNI via Multus                       |
| vxlan    | bridge + VXLAN tunnel between the nodes      | Flannel VXLAN (default), Calico/Cilium VXLAN |
| ipvlan   | like macvlan, one MAC                        | ipvlan CNI via Multus                        |
| ipip     | routed + IP-in-IP tunnel                     | Calico IPIP mode                             |
| gre      | routed + GRE tunnel                          | GRE overlays (OVN/OVS-style encapsulation)   |
| wireguard, ipsec | encrypted tunnels                    | Calico/Cilium WireGuard, Cilium/Flannel IPsec |
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from sluice.net.ipcmd import run_ip
from sluice.net.lab import Lab

VXLAN_OVERHEAD = 50  # outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8
IPIP_OVERHEAD = 20
GRE_OVERHEAD = 24
UNDERLAY = ("10.213.0.1", "10.213.0.2")
POD_NET = ("10.213.1", "10.213.2")
TUNNEL_NET = "10.213.9"


@dataclass(frozen=True)
class Endpoints:
    """Where a measurement's two ends run, and the interface their traffic leaves by."""

    datapath: str
    client_ns: str | None
    client_ip: str
    server_ns: str | None
    server_ip: str
    iface: str
    """Interface name inside both ends' namespaces (what GLOO_SOCKET_IFNAME names)."""
    mtu: int


@dataclass(frozen=True)
class Datapath:
    name: str
    needs: tuple[str, ...]
    """Kernel features (see detect.FEATURES) it cannot be built without."""
    cni: str
    what: str
    build: Callable[[Lab, int], Endpoints] | None
    """None: known, but this lab does not build it (yet)."""
    cross_node: bool = True
    """False for the loopback reference, which no cluster can use between nodes."""


# ---------------------------------------------------------------------- builders
def _nodes(lab: Lab, tag: str, mtu: int) -> tuple[str, str]:
    n0, n1 = lab.add_netns(f"{tag}-n0"), lab.add_netns(f"{tag}-n1")
    m = str(mtu)
    run_ip("link", "add", "sl-ul", "mtu", m, "type", "veth", "peer", "name", "sl-ul", "netns", n1, "mtu", m, netns=n0)
    for ns, addr in zip((n0, n1), UNDERLAY, strict=True):
        run_ip("addr", "add", f"{addr}/24", "dev", "sl-ul", netns=ns)
        run_ip("link", "set", "sl-ul", "up", netns=ns)
        lab.forwarding(ns)
    return n0, n1


def _veth_pod(lab: Lab, tag: str, node: str, i: int, mtu: int, bridge: str | None) -> str:
    """A pod namespace with eth0 (POD_NET[i].2), its peer sl-pod in the node: on `bridge`, or routed."""
    pod = lab.add_netns(f"{tag}-p{i}")
    m = str(mtu)
    run_ip(
        "link", "add", "sl-pod", "mtu", m, "type", "veth", "peer", "name", "eth0", "netns", pod, "mtu", m, netns=node
    )
    if bridge is None:
        run_ip("addr", "add", f"{POD_NET[i]}.1/24", "dev", "sl-pod", netns=node)
    else:
        run_ip("link", "set", "sl-pod", "master", bridge, netns=node)
    run_ip("link", "set", "sl-pod", "up", netns=node)
    run_ip("addr", "add", f"{POD_NET[i]}.2/24", "dev", "eth0", netns=pod)
    run_ip("link", "set", "eth0", "up", netns=pod)
    run_ip("route", "add", "default", "via", f"{POD_NET[i]}.1", netns=pod)
    return pod


def _bridge(node: str, i: int, mtu: int) -> str:
    run_ip("link", "add", "sl-br", "mtu", str(mtu), "type", "bridge", netns=node)
    run_ip("addr", "add", f"{POD_NET[i]}.1/24", "dev", "sl-br", netns=node)
    run_ip("link", "set", "sl-br", "up", netns=node)
    return "sl-br"


def _pod_routes(n0: str, n1: str, via: tuple[str, str] | None, dev: str | None = None) -> None:
    """Each node routes the other's pod subnet: via its underlay/tunnel address, or straight into a tunnel dev."""
    for ns, other, j in ((n0, POD_NET[1], 1), (n1, POD_NET[0], 0)):
        if via is not None:
            run_ip("route", "add", f"{other}.0/24", "via", via[j], netns=ns)
        else:
            assert dev is not None
            run_ip("route", "add", f"{other}.0/24", "dev", dev, netns=ns)


def _pods(lab: Lab, tag: str, nodes: tuple[str, str], mtu: int, bridged: bool) -> tuple[str, str]:
    return (
        _veth_pod(lab, tag, nodes[0], 0, mtu, _bridge(nodes[0], 0, mtu) if bridged else None),
        _veth_pod(lab, tag, nodes[1], 1, mtu, _bridge(nodes[1], 1, mtu) if bridged else None),
    )


def _pod_endpoints(name: str, pods: tuple[str, str], mtu: int) -> Endpoints:
    return Endpoints(name, pods[0], f"{POD_NET[0]}.2", pods[1], f"{POD_NET[1]}.2", "eth0", mtu)


def build_loopback(lab: Lab, mtu: int) -> Endpoints:
    lo_mtu = int(Path("/sys/class/net/lo/mtu").read_text().strip())
    return Endpoints("loopback", None, "127.0.0.1", None, "127.0.0.1", "lo", lo_mtu)


def build_host(lab: Lab, mtu: int) -> Endpoints:
    n0, n1 = _nodes(lab, "host", mtu)
    return Endpoints("host", n0, UNDERLAY[0], n1, UNDERLAY[1], "sl-ul", mtu)


def build_routed(lab: Lab, mtu: int) -> Endpoints:
    nodes = _nodes(lab, "routed", mtu)
    pods = _pods(lab, "routed", nodes, mtu, bridged=False)
    _pod_routes(*nodes, via=UNDERLAY)
    return _pod_endpoints("routed", pods, mtu)


def build_bridge(lab: Lab, mtu: int) -> Endpoints:
    nodes = _nodes(lab, "bridge", mtu)
    pods = _pods(lab, "bridge", nodes, mtu, bridged=True)
    _pod_routes(*nodes, via=UNDERLAY)
    return _pod_endpoints("bridge", pods, mtu)


def _l2_child(lab: Lab, tag: str, kind: str, mode: str, mtu: int) -> Endpoints:
    """macvlan/ipvlan: each pod gets a child of its node's underlay link, on the underlay subnet."""
    nodes = _nodes(lab, tag, mtu)
    pods = []
    for i, node in enumerate(nodes):
        pod = lab.add_netns(f"{tag}-p{i}")
        run_ip("link", "add", "eth0", "link", "sl-ul", "type", kind, "mode", mode, netns=node)
        run_ip("link", "set", "eth0", "netns", pod, netns=node)
        run_ip("addr", "add", f"10.213.0.{11 + i}/24", "dev", "eth0", netns=pod)
        run_ip("link", "set", "eth0", "up", netns=pod)
        pods.append(pod)
    return Endpoints(tag, pods[0], "10.213.0.11", pods[1], "10.213.0.12", "eth0", mtu)


def build_macvlan(lab: Lab, mtu: int) -> Endpoints:
    return _l2_child(lab, "macvlan", "macvlan", "bridge", mtu)


def build_ipvlan(lab: Lab, mtu: int) -> Endpoints:
    return _l2_child(lab, "ipvlan", "ipvlan", "l2", mtu)


def build_vxlan(lab: Lab, mtu: int) -> Endpoints:
    """Flannel's VXLAN backend: a bridge per node (cni0), a VXLAN device (flannel.1) to the
    other node, the other pod subnet routed through it, pod MTU lowered by the 50-byte header."""
    inner = mtu - VXLAN_OVERHEAD
    n0, n1 = _nodes(lab, "vxlan", mtu)
    for i, ns in enumerate((n0, n1)):
        run_ip(
            "link", "add", "sl-vx", "mtu", str(inner), "type", "vxlan", "id", "42", "local", UNDERLAY[i],
            "remote", UNDERLAY[1 - i], "dstport", "4789", "dev", "sl-ul", netns=ns,
        )  # fmt: skip
        run_ip("addr", "add", f"{TUNNEL_NET}.{i + 1}/24", "dev", "sl-vx", netns=ns)
        run_ip("link", "set", "sl-vx", "up", netns=ns)
    pods = _pods(lab, "vxlan", (n0, n1), inner, bridged=True)
    _pod_routes(n0, n1, via=(f"{TUNNEL_NET}.1", f"{TUNNEL_NET}.2"))
    return _pod_endpoints("vxlan", pods, inner)


def _l3_tunnel(lab: Lab, tag: str, kind: str, overhead: int, mtu: int) -> Endpoints:
    """Calico IPIP style: routed pods, the other pod subnet sent into a point-to-point tunnel."""
    inner = mtu - overhead
    n0, n1 = _nodes(lab, tag, mtu)
    for i, ns in enumerate((n0, n1)):
        run_ip(
            "link", "add", "sl-tun", "mtu", str(inner), "type", kind, "local", UNDERLAY[i], "remote",
            UNDERLAY[1 - i], "dev", "sl-ul", netns=ns,
        )  # fmt: skip
        run_ip("link", "set", "sl-tun", "up", netns=ns)
    pods = _pods(lab, tag, (n0, n1), inner, bridged=False)
    _pod_routes(n0, n1, via=None, dev="sl-tun")
    return _pod_endpoints(tag, pods, inner)


def build_ipip(lab: Lab, mtu: int) -> Endpoints:
    return _l3_tunnel(lab, "ipip", "ipip", IPIP_OVERHEAD, mtu)


def build_gre(lab: Lab, mtu: int) -> Endpoints:
    return _l3_tunnel(lab, "gre", "gre", GRE_OVERHEAD, mtu)


DATAPATHS: dict[str, Datapath] = {
    d.name: d
    for d in (
        Datapath("loopback", (), "none (reference)", "both ends in the host namespace on 127.0.0.1", build_loopback,
                 cross_node=False),
        Datapath("host", ("veth",), "hostNetwork: true", "no pod namespace; the node's own link", build_host),
        Datapath("routed", ("veth",), "Calico (BGP, no encapsulation); Cilium native routing",
                 "veth per pod, nodes route pod subnets", build_routed),
        Datapath("bridge", ("veth", "bridge"), "Flannel host-gw; bridge CNI plugin",
                 "veth per pod on a node bridge, nodes route pod subnets", build_bridge),
        Datapath("macvlan", ("veth", "macvlan"), "macvlan CNI (Multus secondary network)",
                 "macvlan child of the node link in each pod", build_macvlan),
        Datapath("vxlan", ("veth", "bridge", "vxlan"), "Flannel VXLAN (default); Calico/Cilium VXLAN mode",
                 "node bridge + VXLAN tunnel between nodes", build_vxlan),
        Datapath("ipvlan", ("veth", "ipvlan"), "ipvlan CNI (Multus); Cilium ipvlan mode",
                 "ipvlan L2 child of the node link in each pod", build_ipvlan),
        Datapath("ipip", ("veth", "ipip"), "Calico IPIP mode", "routed pods + IP-in-IP tunnel", build_ipip),
        Datapath("gre", ("veth", "gre"), "GRE overlays", "routed pods + GRE tunnel", build_gre),
        Datapath("wireguard", ("veth", "wireguard"), "Calico/Cilium WireGuard encryption",
                 "encrypted tunnel (not built by this lab)", None),
        Datapath("ipsec", ("veth", "ipsec_aead"), "Cilium/Flannel IPsec (AES-GCM)",
                 "ESP-encrypted tunnel (not built by this lab)", None),
    )
}  # fmt: skip


def availability(support: Mapping[str, object]) -> dict[str, str | None]:
    """datapath -> None when this lab can build it here, else why not (the missing feature's message)."""
    out: dict[str, str | None] = {}
    for d in DATAPATHS.values():
        missing = [f for f in d.needs if not getattr(support.get(f), "ok", False)]
        if missing:
            out[d.name] = "; ".join(f"{f}: {getattr(support.get(f), 'reason', 'not probed')}" for f in missing)
        elif d.build is None:
            out[d.name] = "the kernel has it, but this lab does not build it yet"
        else:
            out[d.name] = None
    return out
