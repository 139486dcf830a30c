"""Which kernel parts of the datapaths this machine has, found by trying them.

Each probe creates the thing (a link of that kind, an IPsec AEAD state, a netem qdisc) inside
a throw-away namespace of the lab and reports the kernel's own refusal when it fails, so a
missing module reads "ipip: Unknown device type" instead of a failed benchmark. Probing is
the only honest test: /proc/modules lists neither built-in parts nor modules that would load
on demand.
"""

from __future__ import annotations

import subprocess
from dataclasses import asdict, dataclass

from sluice.net.ipcmd import NetLabError, in_netns, run_ip, tool
from sluice.net.lab import Lab, delete_netns

PROBE_A, PROBE_B = "10.213.250.1", "10.213.250.2"


@dataclass(frozen=True)
class Support:
    feature: str
    ok: bool
    reason: str
    """The kernel's or tool's message when not ok; what was created when ok."""

    def to_json(self) -> dict[str, object]:
        return asdict(self)


LINK_PROBES: dict[str, list[str]] = {
    # feature -> `ip link add sl-probe ...` arguments (after the name); sl-pa is a veth parent.
    "bridge": ["type", "bridge"],
    "macvlan": ["link", "sl-pa", "type", "macvlan", "mode", "bridge"],
    "ipvlan": ["link", "sl-pa", "type", "ipvlan", "mode", "l2"],
    "vxlan": ["type", "vxlan", "id", "42", "dstport", "4789", "local", PROBE_A, "remote", PROBE_B],
    "ipip": ["type", "ipip", "local", PROBE_A, "remote", PROBE_B],
    "gre": ["type", "gre", "local", PROBE_A, "remote", PROBE_B],
    "wireguard": ["type", "wireguard"],
}
"""Link kinds, probed in this order."""

OTHER_FEATURES = ("ipsec_aead", "netem")
FEATURES = ("veth", *LINK_PROBES, *OTHER_FEATURES)


def _probe_link(ns: str, kind: str, args: list[str]) -> Support:
    try:
        run_ip("link", "add", "sl-probe", *args, netns=ns)
    except NetLabError as err:
        return Support(kind, False, str(err).split(": ", 1)[-1])
    run_ip("link", "del", "sl-probe", netns=ns, check=False)
    return Support(kind, True, f"created a {kind} link")


def _probe_ipsec(ns: str) -> Support:
    """An ESP tunnel state with AES-GCM (rfc4106), what Cilium's and Calico's IPsec modes use."""
    key = "0x" + "11" * 20  # 16-byte key + 4-byte salt; a dummy in a namespace that carries no traffic
    try:
        run_ip(
            "xfrm", "state", "add", "src", PROBE_A, "dst", PROBE_B, "proto", "esp", "spi", "0x100",
            "reqid", "1", "mode", "tunnel", "aead", "rfc4106(gcm(aes))", key, "128", netns=ns,
        )  # fmt: skip
    except NetLabError as err:
        return Support("ipsec_aead", False, str(err).split(": ", 1)[-1])
    run_ip("xfrm", "state", "flush", netns=ns, check=False)
    return Support("ipsec_aead", True, "created an ESP rfc4106(gcm(aes)) state")


def _probe_netem(ns: str) -> Support:
    tc = tool("tc")
    if tc is None:
        return Support("netem", False, "the `tc` command (iproute2) is not installed")
    argv = in_netns(ns, [tc, "qdisc", "add", "dev", "sl-pa", "root", "netem", "delay", "1ms"])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    if proc.returncode != 0:
        return Support("netem", False, (proc.stderr or proc.stdout).strip() or f"tc exited {proc.returncode}")
    return Support("netem", True, "added a netem qdisc")


def detect(lab: Lab) -> dict[str, Support]:
    """Probe every feature in a namespace of `lab` (deleted again before returning)."""
    ns = lab.add_netns("probe")
    try:
        # The veth pair is itself the veth probe, and the parent of the macvlan/ipvlan probes.
        try:
            run_ip("link", "add", "sl-pa", "type", "veth", "peer", "name", "sl-pb", netns=ns)
            run_ip("link", "set", "sl-pa", "up", netns=ns)
            found = {"veth": Support("veth", True, "created a veth pair")}
        except NetLabError as err:
            found = {"veth": Support("veth", False, str(err).split(": ", 1)[-1])}
        for kind, args in LINK_PROBES.items():
            if "sl-pa" in args and not found["veth"].ok:
                found[kind] = Support(kind, False, "not probed: needs a veth parent, and veth is missing")
            else:
                found[kind] = _probe_link(ns, kind, args)
        found["ipsec_aead"] = _probe_ipsec(ns)
        found["netem"] = _probe_netem(ns)
        return found
    finally:
        delete_netns(ns)
        lab.namespaces.remove(ns)
