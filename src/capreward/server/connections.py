"""Which connections the reward server admits: a total bound, a bound per peer, and slots kept for peers
that hold none, so that one client's slow or idle connections cannot starve another client.

A *peer* is a client address: an IPv4 address, or an IPv6 /64 network (one host is usually given a
whole /64, so its addresses count as one peer); an IPv4-mapped IPv6 address is its IPv4 address.

A new connection from a peer that already holds ``h`` connections, with ``n`` connections open in all,
is admitted when ``n < total``, ``h < per_peer`` and, for ``h > 0``, ``n < total - reserved``: the last
``reserved`` slots go only to peers that hold no connection yet. So whatever one peer does, other peers
can open ``total - per_peer`` connections (at least ``reserved`` of them while others hold the rest), and
up to ``reserved`` peers that hold none get one each, however many peers hold the other slots. A refused
connection is answered 503 at once and closed, without reading anything from it.

How long an admitted connection may hold its slot is the server's deadlines' business (headers within
``header_timeout``, the whole request within ``read_timeout``: see
:class:`~capreward.adapters.openrlhf.ServerLimits`).
"""

from __future__ import annotations

import ipaddress
import threading
from collections import Counter
from typing import Any


def peer_of(address: Any) -> str:
    """The peer key of a socket address (``(host, port, ...)`` or a host string): the IPv4 address,
    or the IPv6 /64 network (``2001:db8:0:1::/64``); anything unparsable is its own string."""
    host = address[0] if isinstance(address, tuple) else address
    try:
        ip = ipaddress.ip_address(str(host).split("%", 1)[0])
    except ValueError:
        return str(host)
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class ConnectionSlots:
    """Thread-safe admission of connections (see the module docstring).

    Args:
        total: connections open at once, all peers together (at least 1).
        per_peer: connections one peer may hold (1..total).
        reserved: of the ``total`` slots, how many only peers holding none may take (0..total-1).
    """

    def __init__(self, total: int, per_peer: int, reserved: int):
        if total < 1 or not 1 <= per_peer <= total or not 0 <= reserved < total:
            raise ValueError(f"bad connection limits: total={total}, per_peer={per_peer}, reserved={reserved} "
                             "(need total >= 1, 1 <= per_peer <= total, 0 <= reserved < total)")
        self.total, self.per_peer, self.reserved = total, per_peer, reserved
        self._held: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.refused = 0  # connections refused so far

    def acquire(self, peer: str) -> str | None:
        """Take a slot for ``peer``: None when admitted, else why not (a sentence for the 503 answer)."""
        with self._lock:
            held, open_ = self._held[peer], sum(self._held.values())
            if open_ >= self.total:
                reason = f"too many connections ({self.total} open)"
            elif held >= self.per_peer:
                reason = f"too many connections from your address (at most {self.per_peer} at once)"
            elif held and open_ >= self.total - self.reserved:
                reason = f"too many connections; the last {self.reserved} are kept for other clients"
            else:
                self._held[peer] += 1
                return None
            self.refused += 1
            return reason

    def release(self, peer: str) -> None:
        """Give back a slot taken by :meth:`acquire`."""
        with self._lock:
            self._held[peer] -= 1
            if self._held[peer] <= 0:
                del self._held[peer]

    def snapshot(self) -> dict[str, int]:
        """``open`` connections, distinct ``peers`` holding them, the ``largest`` number one peer holds,
        and ``refused`` so far (counts only: no addresses)."""
        with self._lock:
            return {"open": sum(self._held.values()), "peers": len(self._held),
                    "largest": max(self._held.values(), default=0), "refused": self.refused}


__all__ = ["ConnectionSlots", "peer_of"]
