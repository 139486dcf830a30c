"""One control plane per Ray namespace: the plane that uses `ray_namespace` claims it.

The agents (`sluice-agent-<node id>`) are found by name in the namespace, so two planes on one
namespace would share them: the second's recovery would adopt or kill the first's jobs as
strays and drain their exits from the agents' polls. So a plane records itself in a detached
actor `sluice-plane` of the namespace (its plane id, kept in `$SLUICE_HOME/plane-id`, its
home, host and pid) and keeps a liveness actor of its own (`sluice-plane-alive-<token>`, not
detached: Ray ends it when the plane's driver goes, `kill -9` included). A plane with another
plane id is refused while the recorded owner's liveness actor answers; the same plane (same
home, so same plane id) takes the namespace over, which is how `sluice down`/`up` and a
restart after `kill -9` adopt the jobs.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sluice.agent.node_owners import NodeInUse
from sluice.engine.base import EngineTaken

log = logging.getLogger("sluice.engine.ray")

CLAIM_NAME = "sluice-plane"
ALIVE_PREFIX = "sluice-plane-alive-"
PLANE_ID_FILE = "plane-id"


class NamespaceInUse(NodeInUse):
    """Another live control plane uses the Ray namespace (and so the agents in it)."""


@dataclass(frozen=True)
class PlaneIdentity:
    plane_id: str
    home: str
    host: str
    pid: int
    alive: str
    """Name of the plane's liveness actor in the namespace."""


def plane_id(home: Path) -> str:
    """This home's plane id (`home/plane-id`), made once: the same home is the same plane."""
    path = home / PLANE_ID_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    home.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as f:
        f.write(uuid.uuid4().hex + "\n")
    return path.read_text().strip()


class NamespaceClaim:
    """The detached actor holding the namespace's owner (plain dicts: PlaneIdentity fields)."""

    def __init__(self) -> None:
        self.owner: dict[str, Any] | None = None

    def get(self) -> dict[str, Any] | None:
        return self.owner

    def take(self, me: dict[str, Any], expected: dict[str, Any] | None) -> bool:
        """Become the owner if the owner is still the one the caller checked."""
        if self.owner != expected:
            return False
        self.owner = me
        return True

    def hold(self, me: dict[str, Any]) -> bool:
        """Renewal: record `me` again if the record was lost (this actor restarted); False if
        another plane owns the namespace now."""
        if self.owner is None:
            self.owner = me
        return self.owner == me

    def release(self, me: dict[str, Any]) -> None:
        if self.owner == me:
            self.owner = None


class PlaneAlive:
    """The owner's liveness actor: it exists exactly as long as the owning plane's driver."""

    def ping(self) -> bool:
        return True


def _on_this_node(ray: Any) -> Any:
    """Pin to the driver's own Ray node. Placed anywhere, the liveness actor went with whichever
    node Ray put it on: that node lost, a second plane was given the namespace while this one
    ran on (both then drove the same agents). Pinned, it goes only when this process's node
    does, which the driver does not outlive."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


class Claim:
    """This plane's claim on `namespace` (driver side)."""

    def __init__(self, ray: Any, namespace: str, home: Path, timeout_s: float = 30.0) -> None:
        """Claim the namespace or raise NamespaceInUse (one line, naming how to choose another)."""
        self._ray = ray
        self.namespace = namespace
        self.timeout_s = timeout_s
        self._held: Any = None
        """The newest renewal's answer, not yet looked at (`hold`)."""
        token = uuid.uuid4().hex[:12]
        self.me = PlaneIdentity(
            plane_id(home), str(home.resolve()), socket.gethostname(), os.getpid(), ALIVE_PREFIX + token
        )
        opts = {"namespace": namespace, "num_cpus": 0}
        self._actor = (
            ray.remote(NamespaceClaim)
            .options(name=CLAIM_NAME, lifetime="detached", get_if_exists=True, max_restarts=-1, **opts)
            .remote()
        )
        self._alive = (
            ray.remote(PlaneAlive).options(name=self.me.alive, scheduling_strategy=_on_this_node(ray), **opts).remote()
        )
        ray.get(self._alive.ping.remote(), timeout=timeout_s)
        mine = asdict(self.me)
        for _ in range(5):
            owner = ray.get(self._actor.get.remote(), timeout=timeout_s)
            if owner is not None and owner.get("plane_id") != self.me.plane_id and self._owner_alive(owner):
                ray.kill(self._alive)
                raise NamespaceInUse(
                    f"the Ray namespace {namespace!r} is used by another sluice control plane "
                    f"(home {owner.get('home')} on {owner.get('host')}, pid {owner.get('pid')}); "
                    "give this plane a namespace of its own: ray_namespace in settings.yaml or SLUICE_RAY_NAMESPACE"
                )
            if ray.get(self._actor.take.remote(mine, owner), timeout=timeout_s):
                if owner is not None and owner.get("plane_id") == self.me.plane_id:
                    log.info(
                        "Ray namespace %r: taking over from this plane's earlier run (pid %s)",
                        namespace,
                        owner.get("pid"),
                    )
                return
        raise NamespaceInUse(f"the Ray namespace {namespace!r}: another plane keeps claiming it; try again")

    def _owner_alive(self, owner: dict[str, Any]) -> bool:
        try:
            handle = self._ray.get_actor(str(owner.get("alive")), namespace=self.namespace)
        except ValueError:  # no such actor: its plane's driver is gone
            return False
        try:
            return bool(self._ray.get(handle.ping.remote(), timeout=self.timeout_s))
        except self._ray.exceptions.GetTimeoutError:
            return True  # slow, not gone: refusing is the safe side
        except self._ray.exceptions.RayActorError:
            return False

    def hold(self) -> None:
        """Renew the record, and look at what the previous renewal answered (never waiting: a
        renewal not answered yet is looked at next time). The record is lost when the claim
        actor's node dies; if another plane started in that gap it holds the namespace now,
        and the previous renewal said so: EngineTaken, and this plane stops acting."""
        previous, self._held = self._held, self._actor.hold.remote(asdict(self.me))
        if previous is None:
            return
        try:
            ready, _ = self._ray.wait([previous], num_returns=1, timeout=0)
            still_mine = self._ray.get(previous, timeout=0) if ready else True
        except Exception as err:  # the claim actor restarting: the next renewal tells
            log.debug("renewing the Ray namespace claim: %s", err)
            return
        if still_mine is False:
            try:
                owner = self._ray.get(self._actor.get.remote(), timeout=self.timeout_s) or {}
            except Exception:
                owner = {}
            raise EngineTaken(
                f"another plane (home {owner.get('home')} on {owner.get('host')}, pid {owner.get('pid')}) "
                f"took the Ray namespace {self.namespace!r} while its record was lost with its node"
            )

    def release(self) -> None:
        try:
            self._ray.get(self._actor.release.remote(asdict(self.me)), timeout=5)
            self._ray.kill(self._alive)
        except Exception as err:  # the cluster is going away: the liveness actor dies with us anyway
            log.debug("releasing the Ray namespace: %s", err)
