"""A network namespace of the test's own, joined to this one by two veth pairs: one that
carries the database traffic (the one a test cuts: see :meth:`Namespace.cut`) and
one that carries the model calls. The addresses are link-local (169.254.0.0/16), on
links that exist only between this namespace and the test's own."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass

from .servers import unavailable

#: A locally administered hardware address no interface here has.
NOWHERE = "02:00:5e:00:00:01"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass
class Namespace:
    name: str
    #: Host-side and namespace-side addresses of the database link and the call link.
    db_host: str
    db_peer: str
    call_host: str
    call_peer: str
    db_link: str
    call_link: str

    def cut(self) -> None:
        """Lose every packet on the database link, silently, both ways, as in a real
        partition: each end's neighbour entry for the other points at a hardware
        address nobody has, so frames leave and are dropped on arrival. Sending
        succeeds, nothing is reset, and TCP backs its retransmissions off as it does
        on a lossy path. (Taking the link down instead would fail each send locally,
        and Linux retries a locally failed send every half second: recovery would
        look quicker than it is on a network.)"""
        _ip("-n", self.name, "neigh", "replace", self.db_host, "lladdr", NOWHERE,
            "dev", self.db_link + "n", "nud", "permanent")
        _ip("neigh", "replace", self.db_peer, "lladdr", NOWHERE, "dev", self.db_link,
            "nud", "permanent")

    def join(self) -> None:
        """Deliver the database link's packets again (the ends find each other anew)."""
        _ip("-n", self.name, "neigh", "del", self.db_host, "dev", self.db_link + "n")
        _ip("neigh", "del", self.db_peer, "dev", self.db_link)

    def command(self, *cmd: str) -> list[str]:
        """``cmd`` run inside the namespace (same process id: ``ip netns exec`` execs)."""
        return ["ip", "netns", "exec", self.name, *cmd]

    def close(self) -> None:
        for link in (self.db_link, self.call_link):
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("link", "del", link)
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("netns", "del", self.name)


def make_namespace(subnet: int = 231) -> Namespace:
    """A namespace ``lgc-XXXX`` with a database link 169.254.{subnet}.1-2 and a call link
    169.254.{subnet+1}.1-2 (up to the caller to ``close``)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        unavailable("the partition scenario needs root and iproute2 (ip netns)")
    tag = secrets.token_hex(2)
    ns = Namespace(f"lgc-{tag}", f"169.254.{subnet}.1", f"169.254.{subnet}.2",
                   f"169.254.{subnet + 1}.1", f"169.254.{subnet + 1}.2",
                   f"lgdb{tag}", f"lgcl{tag}")
    try:
        _ip("netns", "add", ns.name)
        _ip("-n", ns.name, "link", "set", "lo", "up")
        for link, host, peer in ((ns.db_link, ns.db_host, ns.db_peer),
                                 (ns.call_link, ns.call_host, ns.call_peer)):
            inner = link + "n"
            _ip("link", "add", link, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", ns.name)
            _ip("addr", "add", f"{host}/30", "dev", link)
            _ip("link", "set", link, "up")
            _ip("-n", ns.name, "addr", "add", f"{peer}/30", "dev", inner)
            _ip("-n", ns.name, "link", "set", inner, "up")
    except subprocess.CalledProcessError as exc:
        ns.close()
        unavailable(f"cannot make a network namespace here: {exc.stderr.strip()}")
    return ns
