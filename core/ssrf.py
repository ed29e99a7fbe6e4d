"""Keep outbound webhook calls away from internal networks (SSRF guard).

A webhook URL is chosen by a caller of our API, so it must never reach the machine itself, the private
network or a cloud metadata service. The guard resolves the host once, refuses the request if the address
is not public, and pins the connection to that checked address (so a second DNS answer cannot swap in an
internal one: the DNS-rebinding trick). The structure follows requests-hardened's IPFilterAdapter; the
policy is ours because `WEBHOOK_ALLOW_PRIVATE_TARGETS` must open loopback *and* private ranges for local
development while metadata addresses stay closed whatever the setting.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, NoReturn
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from requests.structures import CaseInsensitiveDict
from requests_hardened.ip_filter import EXTRA_BLOCKED_NET_RANGES
from urllib3.util.connection import allowed_gai_family

if TYPE_CHECKING:
    from requests.adapters import _HostParams, _PoolKwargs

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Instance metadata services of the big clouds. Never reachable, not even with private targets allowed:
# a webhook that can read the metadata service can read the machine's cloud credentials.
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean
        "169.254.170.2",  # AWS ECS task metadata
        "169.254.169.123",  # AWS time sync
        "100.100.100.200",  # Alibaba Cloud
        "fd00:ec2::254",  # AWS IMDS over IPv6
    )
)
LINK_LOCAL_V4 = ipaddress.ip_network("169.254.0.0/16")


class UnsafeTargetError(requests.exceptions.RequestException):
    """The target resolves to an address the guard refuses; no connection was attempted."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"refused target address ({reason})")
        self.reason = reason


def _normalise(ip: IPAddress) -> IPAddress:
    # An IPv4-mapped IPv6 address (::ffff:127.0.0.1) reaches the IPv4 host: judge it as IPv4.
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def address_refusal(ip: IPAddress | str, *, allow_private: bool) -> str | None:
    """Return why `ip` must not be a webhook target, or None if it may be.

    A pure decision on data: tests check it for internal addresses without connecting anywhere.
    """
    address = _normalise(ipaddress.ip_address(ip) if isinstance(ip, str) else ip)
    if address in METADATA_ADDRESSES:
        return "metadata"
    if address.is_link_local or (address.version == 4 and address in LINK_LOCAL_V4):
        # Link-local hosts other metadata endpoints on some clouds; there is no legitimate webhook there.
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if address.is_unspecified:
        # 0.0.0.0 and :: connect to the local machine on Linux.
        return "unspecified"
    if address.is_loopback:
        return None if allow_private else "loopback"
    if address.is_private or address.is_reserved or any(address in net for net in EXTRA_BLOCKED_NET_RANGES):
        return None if allow_private else "private"
    return None


def url_refusal(url: str, *, allow_private: bool) -> str | None:
    """Return why `url` must not be stored as a target, or None: not http(s), or a literal address refused.

    A host name is not resolved here (it may change before it is used): the sender resolves and checks it on
    every request. This is the check made when a caller hands us a URL (event endpoints, chat webhooks).
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "not an http(s) URL"
    try:
        ip = ipaddress.ip_address(parts.hostname.strip("[]"))
    except ValueError:
        return None
    return address_refusal(ip, allow_private=allow_private)


def resolve_target(host: str, port: int, *, allow_private: bool) -> IPAddress:
    """Resolve `host` and return the address to connect to; raise UnsafeTargetError if any is refused.

    Every address the name resolves to is checked, not only the first, so a name that mixes a public and
    an internal address is refused whichever one the resolver happens to list first.
    """
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, port, family=allowed_gai_family(), type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise requests.exceptions.ConnectionError("could not resolve the target host") from exc
    addresses: list[IPAddress] = []
    for family, _type, _proto, _canon, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        addresses.append(ipaddress.ip_address(sockaddr[0]))
    if not addresses:
        raise requests.exceptions.ConnectionError("the target host has no address")
    for address in addresses:
        reason = address_refusal(address, allow_private=allow_private)
        if reason:
            raise UnsafeTargetError(reason)
    return _normalise(addresses[0])


class GuardedAdapter(HTTPAdapter):
    """A requests adapter that connects only to checked addresses, pinned for the request.

    The URL keeps its host name for the Host header, TLS SNI and certificate checks; only the TCP
    connection goes to the resolved, checked IP. Connection pools are keyed by that IP, so keep-alive
    still works across requests to the same receiver.
    """

    def __init__(self, *, https: bool, allow_private: bool, pool_maxsize: int = 10) -> None:
        super().__init__(pool_connections=pool_maxsize, pool_maxsize=pool_maxsize, max_retries=0)
        self._https = https
        self._allow_private = allow_private

    def build_connection_pool_key_attributes(
        self, request: requests.PreparedRequest, verify: bool | str, cert: str | tuple[str, str] | None = None
    ) -> tuple[_HostParams, _PoolKwargs]:
        """Resolve and check the host, then key the pool on the pinned address."""
        host_params, pool_kwargs = super().build_connection_pool_key_attributes(request, verify, cert)
        # Copy the headers: they may be shared with the caller's dict.
        request.headers = CaseInsensitiveDict(request.headers or {})
        original_host = host_params["host"]
        port = host_params["port"] or (443 if self._https else 80)
        host_header = f"[{original_host}]" if ":" in original_host else original_host
        if host_params["port"] is not None:
            host_header += f":{host_params['port']}"
        request.headers["Host"] = host_header
        if self._https:
            # Verify the certificate against the name in the URL, not the pinned IP.
            # urllib3's pools take these TLS keys; the stubs' _PoolKwargs lists only those requests itself sets.
            pool_kwargs["assert_hostname"] = original_host  # type: ignore[typeddict-unknown-key]
            pool_kwargs["server_hostname"] = original_host  # type: ignore[typeddict-unknown-key]
        address = resolve_target(original_host, port, allow_private=self._allow_private)
        host_params["host"] = str(address) if address.version == 4 else f"[{address}]"
        return host_params, pool_kwargs

    def get_connection(self, url: str | bytes, proxies: Mapping[str, str] | None = None) -> NoReturn:
        """Refuse the deprecated entry point, which would bypass the address check."""
        raise NotImplementedError("GuardedAdapter supports get_connection_with_tls_context only")
