"""Who may talk to the server: the Host allow-list, the Origin check and CORS, the bearer token, the
body's content type.

A web page can send requests to a loopback server. A page on another site is stopped by the
Origin check, and its "simple" requests (text/plain or form bodies, sent without a preflight) by
the content-type rule; a page whose own name was rebound to 127.0.0.1 (DNS rebinding) sends its
own name as Host, and the Host allow-list stops it. Clients that are not browsers (curl, SDKs,
this pack's remote loader) send no Origin and pass.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from dataclasses import dataclass

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("0.0.0.0", "::", "")
ORIGIN = re.compile(r"^https?://(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(:\d{1,5})?$")
HOST_NAME = re.compile(r"^(\[[0-9a-f:.]+\]|[a-z0-9.-]+|[0-9a-f:.]+)$")
PREFLIGHT_HEADERS = {"Access-Control-Allow-Methods": "GET, POST", "Access-Control-Allow-Headers":
                     "Authorization, Content-Type", "Access-Control-Max-Age": "600"}


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
        return True
    except ValueError:
        return False


def host_name(header: str) -> str | None:
    """The name in a Host header ('[::1]:8190' -> '::1'), lowercased; None when it is malformed."""
    value = header.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        return name if rest == "" or re.fullmatch(r":\d{1,5}", rest) else None
    if value.count(":") > 1:
        return value if is_ip(value) else None  # a bare IPv6 address
    name, colon, port = value.partition(":")
    if colon and not port.isdigit():
        return None
    return name if HOST_NAME.match(name) else None


def normal_origin(value: str) -> str:
    """An origin as browsers send it: lowercase scheme://host[:port], the scheme's default port left out."""
    value = value.strip().lower().rstrip("/")
    for scheme, port in (("http://", ":80"), ("https://", ":443")):
        if value.startswith(scheme) and value.endswith(port):
            value = value[: -len(port)]
    return value


@dataclass(frozen=True)
class Policy:
    """The rules one server was started with."""

    token: str = ""
    hosts: frozenset = frozenset(LOOPBACK_NAMES)
    origins: frozenset = frozenset()
    any_ip: bool = False  # bound to every address (0.0.0.0, ::): reached by any of the machine's addresses

    @classmethod
    def of(cls, token: str, bind: str, allowed_hosts=(), allowed_origins=()) -> Policy:
        names = set(LOOPBACK_NAMES) | {h.lower().strip("[]") for h in allowed_hosts}
        if bind not in WILDCARDS:
            names.add(bind.lower().strip("[]"))
        return cls(token, frozenset(names), frozenset(normal_origin(o) for o in allowed_origins),
                   bind in WILDCARDS)

    def host_refusal(self, header: str | None) -> str | None:
        """Why this Host header is refused, or None. No header (HTTP/1.0 tools) passes: browsers always send one."""
        if header is None:
            return None
        name = host_name(header)
        if name is not None and (name in self.hosts or (self.any_ip and is_ip(name))):
            return None
        shown = header[:60].encode("ascii", "replace").decode()
        return (f"the Host header {shown!r} is not a name this server answers to ({', '.join(sorted(self.hosts))}); "
                "a page that rebinds its own name to this machine would send it. If you reach the server by that "
                "name, start it with --allowed-host NAME")

    def origin_refusal(self, origin: str | None, host: str | None, scheme: str) -> str | None:
        """Why a request from the page at `origin` is refused, or None (no Origin, its own, or allowed)."""
        if origin is None:
            return None
        mine = normal_origin(f"{scheme}://{host}") if host else None
        if normal_origin(origin) in self.origins or normal_origin(origin) == mine:
            return None
        shown = origin[:80].encode("ascii", "replace").decode()
        return (f"the Origin header says this request comes from a page at {shown!r}, another site; pages may "
                "not use this server unless it was started with --allow-origin ORIGIN for them")

    def allowed_origin(self, origin: str | None) -> bool:
        return origin is not None and normal_origin(origin) in self.origins

    def token_accepted(self, header: str) -> bool:
        """'Bearer <token>' (the scheme in any case), compared in constant time; junk is simply refused."""
        if not self.token:
            return True
        if not header.isascii():
            return False
        scheme, _, given = header.strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token.encode())


def json_content(header: str | None) -> bool:
    """application/json, with or without parameters (a charset): never a type a page sends without a preflight."""
    return header is not None and header.split(";", 1)[0].strip().lower() == "application/json"
