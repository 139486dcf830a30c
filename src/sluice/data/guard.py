"""Where the control plane and node agents may fetch a tenant's dataset from.

A dataset source is a URL a tenant typed. The plane lists it at `dataset create` and the node
agents fetch it at `dataset warm` — with the plane's own file permissions and from inside the
cluster's network. Unchecked, a tenant could register `file:///etc/ssh` and read the plane's
files through the cache, or `http://127.0.0.1:PORT` / `http://169.254.169.254/` and make the
plane request its own loopback or the cloud metadata service (server-side request forgery).

`SourceGuard` is the admin's policy (from Settings: `dataset_roots`, `allow_source_hosts`):
- local sources only under an admin-configured root, after resolving symlinks;
- http(s) and S3 (its `endpoint_url`) hosts must not be loopback, link-local, private,
  multicast, reserved or unspecified — every address the name resolves to — unless the admin
  allow-listed the host name or a network holding the address;
- only the storage options sluice knows to be harmless, so a tenant cannot slip in a proxy.

The check runs three times, because a name can resolve differently later (DNS rebinding) and a
server can redirect: up front (a clear 422 naming the field), in the HTTP client's resolver
(what is actually connected to: a refused address is never dialled) and on every redirect hop.
Jobs' own reads are not guarded here: a job is the tenant's code and reaches what its process
may reach; this guards only what sluice fetches on a tenant's behalf.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import os
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

from sluice.data.errors import DataError
from sluice.spec.dataset import SOURCE_SCHEMES

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SCHEMES = SOURCE_SCHEMES
"""What sluice fetches on a tenant's behalf: the spec's own list (spec/dataset.py), so the
schemes a refusal names are exactly those accepted. `memory://` is not one: it is the plane's
own process memory, shared by every tenant."""

OPTION_TYPES: dict[str, dict[str, type]] = {
    "file": {},
    "http": {},
    "s3": {
        "key": str,
        "secret": str,
        "token": str,
        "endpoint_url": str,
        "anon": bool,
        "requester_pays": bool,
        "version_aware": bool,
    },
}
"""Storage options a tenant may set, per protocol, with the type each takes. Anything else (a
`proxy`, client or config arguments) could point the fetch somewhere the guard did not check."""

SAFE_OPTIONS: dict[str, frozenset[str]] = {family: frozenset(opts) for family, opts in OPTION_TYPES.items()}

_BOOL_WORDS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
"""Spellings of a boolean option given as a string (what specs had to write before options
could be booleans). `"false"` must mean False: passed on as a string it is truthy."""


class SourceRefused(DataError):
    """A dataset source (or one of its storage options) the admin's policy does not allow.
    `field` names the spec field: `source` or `storage_options.<key>`."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


def option_family(url: str) -> str:
    """The protocol family whose options apply to `url`: file, http, s3 (or its own scheme)."""
    proto = url.split("://", 1)[0].lower() if "://" in url else "file"
    return {"local": "file", "https": "http"}.get(proto, proto)


def option_value(family: str, key: str, value: Any) -> Any:
    """`value` as the option `key` of a `family` source takes it: a boolean option given as
    "true"/"false" (yes/no, 1/0) becomes a boolean; a value of the wrong type is a
    SourceRefused naming the option. Options sluice has no type for pass unchanged."""
    want = OPTION_TYPES.get(family, {}).get(key)
    if want is bool:
        if isinstance(value, bool):
            return value
        word = _BOOL_WORDS.get(value.strip().lower()) if isinstance(value, str) else None
        if word is None:
            raise SourceRefused(f"storage_options.{key}", f"must be true or false, not {value!r}")
        return word
    if want is str and not isinstance(value, str):
        raise SourceRefused(f"storage_options.{key}", f"must be a string, not {value!r}")
    return value


def normalized_options(url: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The storage options as fsspec should get them (see option_value)."""
    family = option_family(url)
    return {k: option_value(family, k, v) for k, v in (storage_options or {}).items()}


def address_refusal(ip: IPAddress) -> str | None:
    """Why sluice will not connect to `ip` on a tenant's behalf, or None when it may."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for kind, hit in (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("private", ip.is_private),
        ("reserved", ip.is_reserved),
    ):
        if hit:
            return f"a {kind} address"
    if not ip.is_global:  # shared address space (100.64/10) and the like
        return "not a public address"
    return None


DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class AllowEntry:
    """One `allow_source_hosts` entry: a host name or an IP network, and the one port it allows
    (None: every port, as entries without one always meant)."""

    host: str
    network: IPNetwork | None
    port: int | None

    def allows_port(self, port: int | None) -> bool:
        return self.port is None or port == self.port


def parse_allow_entry(entry: str) -> AllowEntry:
    """`HOST[:PORT]`: a host name, an IPv4 address or network (`10.0.0.0/8`), or an IPv6 one in
    brackets (`[fd00::/8]`, `[fd00::1]:9000`); with a port, only that port. ValueError names the
    problem. Without the port an allowed host is reachable on every port, its admin services
    included, which is rarely what an admin meant by naming an object store."""
    text = entry.strip().lower()
    if not text:
        raise ValueError("an empty entry")
    port: int | None = None
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"{entry!r}: an IPv6 entry is [ADDRESS or NETWORK] or [...]:PORT")
        port_text = rest[1:] if rest else None
    elif text.count(":") > 1:  # IPv6 without brackets (as entries were written before ports): no port
        host, port_text = text, None
        try:
            ipaddress.ip_network(host, strict=False)
        except ValueError:
            raise ValueError(
                f"{entry!r}: not an IPv6 address or network; with a port, write it in brackets: [fd00::1]:9000"
            ) from None
    else:
        host, _, port_text = text.partition(":") if ":" in text else (text, "", None)
    if port_text is not None:
        # isascii: '²' passes isdigit() and int() fails on it; '９０００' passed as 9000.
        if not (port_text.isascii() and port_text.isdigit()) or not 1 <= int(port_text) <= 65535:
            raise ValueError(f"{entry!r}: the port must be a number from 1 to 65535")
        port = int(port_text)
    try:
        network: IPNetwork | None = ipaddress.ip_network(host, strict=False)
    except ValueError:
        network = None
        if any(c in host for c in "/[]") or not _HOST_NAME.fullmatch(host.rstrip(".")):
            raise ValueError(f"{entry!r}: not a host name, an IP address or a network (CIDR)") from None
        if _NUMERIC_LABEL.fullmatch(host.rstrip(".").rsplit(".", 1)[-1]):
            # `010.0.0.1`, `10.0.0.256`: no address to ipaddress, so it was kept as a name, which
            # the resolver reads as an address of its own (010 is octal: 8.0.0.1).
            raise ValueError(
                f"{entry!r}: not an IP address; write an IPv4 address as four numbers 0-255, no leading zeros"
            ) from None
    if isinstance(network, ipaddress.IPv6Network) and network.subnet_of(_V4_MAPPED):
        # The guard compares an IPv4-mapped address as the IPv4 address it maps: this entry matched nothing.
        raise ValueError(f"{entry!r}: an IPv4-mapped IPv6 entry allows nothing; write the IPv4 address or network")
    return AllowEntry(host.rstrip("."), network, port)


_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")
"""A host whose last label is a number is an IPv4 address to URL parsers and resolvers."""
_V4_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


_HOST_NAME = re.compile(r"(?=.{1,253}$)[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*")


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None


@dataclass(frozen=True)
class SourceGuard:
    """The admin's policy for dataset sources. Empty defaults: no local source at all, and only
    public addresses."""

    roots: tuple[str, ...] = ()
    """Folders local sources must lie under (symlinks resolved)."""
    allow_hosts: tuple[str, ...] = ()
    """Host names (exact, case-insensitive) and IP networks/addresses (CIDR) allowed although
    not public, each on one port or every port (`parse_allow_entry`)."""

    @classmethod
    def of(cls, roots: Iterable[str | os.PathLike[str]], allow_hosts: Iterable[str]) -> SourceGuard:
        return cls(tuple(os.path.realpath(r) for r in roots), tuple(h.strip().lower() for h in allow_hosts))

    # -- the pieces ----------------------------------------------------------------------
    @functools.cached_property
    def _entries(self) -> list[AllowEntry]:
        out = []
        for h in self.allow_hosts:
            try:
                out.append(parse_allow_entry(h))
            except ValueError:
                continue  # Settings refuses these; a guard built by hand simply allows nothing by them
        return out

    def host_named(self, host: str, port: int | None = None) -> bool:
        """Whether `host` is allowed by name on `port` (None: the entry must allow every port)."""
        name = host.lower().rstrip(".")
        return any(e.network is None and e.host == name and e.allows_port(port) for e in self._entries)

    def address_problem(self, ip: IPAddress, port: int | None = None) -> str | None:
        """Why `ip` is refused under this policy on `port` (None: any port), or None."""
        why = address_refusal(ip)
        if why is None:
            return None
        plain = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped else ip
        if any(
            e.network is not None and e.network.version == plain.version and plain in e.network and e.allows_port(port)
            for e in self._entries
        ):
            return None
        return why

    def check_host(self, host: str, field: str = "source", resolve: bool = True, port: int | None = None) -> None:
        """Refuse a host that is, or resolves to any address that is, not allowed on `port`."""
        if not host:
            raise SourceRefused(field, "the URL names no host")
        if self.host_named(host, port):
            return
        lit = _literal(host)
        if lit is not None:
            addrs = [lit]
        elif not resolve:
            return
        else:
            try:
                infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
            except OSError as err:
                raise SourceRefused(field, f"cannot resolve host {host!r}: {err}") from None
            addrs = [ipaddress.ip_address(str(i[4][0]).split("%", 1)[0]) for i in infos]
        for ip in addrs:
            why = self.address_problem(ip, port)
            if why is not None:
                via = " is" if lit is not None else f" resolves to {ip}, which is"
                raise SourceRefused(
                    field,
                    f"host {host!r}{via} {why}; sluice does not fetch from such addresses on a tenant's "
                    f"behalf unless the admin allow-lists the host{_on_port(port)} (setting allow_source_hosts)",
                )

    def check_local(self, path: str, field: str = "source") -> str:
        """The real path of a local source, if it lies under an admin root."""
        real = os.path.realpath(path)
        for root in self.roots:
            if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
                return real
        where = ", ".join(self.roots) if self.roots else "none are configured"
        raise SourceRefused(
            field,
            f"local path {path!r} (resolves to {real}) is outside the folders the admin allows for "
            f"datasets (setting dataset_roots: {where})",
        )

    def check(self, url: str, storage_options: Mapping[str, Any] | None = None, resolve: bool = True) -> None:
        """Everything checkable before a connection: scheme, local root, hosts, option names."""
        if "::" in re.sub(r"\[[0-9a-fA-F:.%]*\]", "", url):  # bracketed IPv6 hosts aside
            raise SourceRefused("source", "chained fsspec URLs (with '::') are not accepted")
        if "://" not in url:
            proto, rest = "file", url
        else:
            proto, rest = url.split("://", 1)
            proto = proto.lower()
        if proto not in SCHEMES:
            raise SourceRefused("source", f"scheme {proto!r} is not fetched by sluice; use one of {', '.join(SCHEMES)}")
        family = {"local": "file", "https": "http"}.get(proto, proto)
        for key, value in (storage_options or {}).items():
            if key not in SAFE_OPTIONS[family]:
                allowed = ", ".join(sorted(SAFE_OPTIONS[family])) or "none"
                raise SourceRefused(f"storage_options.{key}", f"not accepted for {proto} sources (accepted: {allowed})")
            option_value(family, key, value)
        if family == "file":
            self.check_local(rest if "://" in url else url)
        elif family == "http":
            parts = urlsplit(url)
            if parts.query or parts.fragment or url.endswith(("?", "#")):
                # sluice lists the page and fetches <source>/<item>: after a query or fragment the
                # item's path is part of it, so every item read back as the folder's own page.
                raise SourceRefused(
                    "source",
                    f"{url!r} has a query ('?...') or fragment ('#...'): sluice adds each item's path to the "
                    "source URL, so give the folder's URL without them",
                )
            self.check_host(parts.hostname or "", "source", resolve, _url_port(parts, "source"))
        elif family == "s3":
            endpoint = (storage_options or {}).get("endpoint_url")
            if endpoint is not None:
                field = "storage_options.endpoint_url"
                parts = urlsplit(str(endpoint))
                if parts.scheme not in ("http", "https"):
                    raise SourceRefused(field, "must be an http(s) URL")
                self.check_host(parts.hostname or "", field, resolve, _url_port(parts, field))

    # -- what the HTTP clients run ---------------------------------------------------------
    def resolver(self) -> Any:
        """An aiohttp resolver that refuses names resolving to addresses the policy refuses: the
        address checked is the address dialled, so DNS rebinding after `check` gains nothing."""
        from aiohttp.abc import AbstractResolver

        guard = self

        class GuardedResolver(AbstractResolver):
            async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[Any]:
                loop = asyncio.get_running_loop()
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, family=family)
                out = []
                for fam, _type, proto, _canon, addr in infos:
                    ip = ipaddress.ip_address(str(addr[0]).split("%", 1)[0])
                    if not guard.host_named(host, port):
                        why = guard.address_problem(ip, port)
                        if why is not None:
                            # Not an OSError: fsspec's listing swallows those as "no files".
                            raise SourceRefused(
                                "source",
                                f"sluice refused {host}:{port} -> {ip}: {why} (setting allow_source_hosts)",
                            )
                    out.append(
                        {"hostname": host, "host": str(ip), "port": addr[1], "family": fam, "proto": proto, "flags": 0}
                    )
                if not out:
                    raise OSError(f"cannot resolve {host}")
                return out

            async def close(self) -> None:
                return None

        return GuardedResolver()

    def _trace(self) -> Any:
        """Checks of literal-IP hosts (which aiohttp does not resolve) on the first request and
        on every redirect's target."""
        import aiohttp
        from yarl import URL

        trace = aiohttp.TraceConfig()

        async def on_start(_s: Any, _c: Any, params: aiohttp.TraceRequestStartParams) -> None:
            self.check_host(params.url.host or "", resolve=False, port=params.url.port)

        async def on_redirect(_s: Any, _c: Any, params: aiohttp.TraceRequestRedirectParams) -> None:
            loc = params.response.headers.get("Location") or params.response.headers.get("URI")
            if loc is None:
                return
            target = params.url.join(URL(loc))
            if target.scheme not in ("http", "https"):
                raise SourceRefused("source", f"redirect to {target.scheme}:// refused")
            self.check_host(target.host or "", resolve=False, port=target.port)

        trace.on_request_start.append(on_start)
        trace.on_request_redirect.append(on_redirect)
        return trace

    def fsspec_options(self, protocol: str) -> dict[str, Any]:
        """Options that make fsspec's own clients enforce the policy at connect time."""
        if protocol in ("http", "https"):
            guard = self

            async def get_client(**kwargs: Any) -> Any:
                import aiohttp

                kwargs.pop("loop", None)
                return aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(resolver=guard.resolver()),
                    trace_configs=[guard._trace()],
                    trust_env=False,
                    **kwargs,
                )

            return {"get_client": get_client}
        if protocol == "s3":
            return {"config_kwargs": {"connector_args": {"resolver": self.resolver()}}}
        return {}


def _url_port(parts: SplitResult, field: str) -> int:
    """The port a URL connects to: its own, or its scheme's default."""
    try:
        port = parts.port
    except ValueError:
        raise SourceRefused(field, f"{parts.netloc!r} has a port that is not a number from 0 to 65535") from None
    return port if port is not None else DEFAULT_PORTS.get(parts.scheme.lower(), 80)


def _on_port(port: int | None) -> str:
    return "" if port is None else f" on port {port}"


def guard_from(settings: Any) -> SourceGuard:
    """The guard an admin configured in sluice Settings (`dataset_roots`, `allow_source_hosts`)."""
    return SourceGuard.of(
        getattr(settings, "dataset_roots", ()) or (), getattr(settings, "allow_source_hosts", ()) or ()
    )
