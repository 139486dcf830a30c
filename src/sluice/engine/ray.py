"""The Ray engine: sluice's node agents, one per Ray node, driven from the control plane.

Ray provides what a multi-node platform needs and sluice should not rebuild: a membership
service with health-checked nodes, placement of a process on a given node, and durable
named actors. A plane first claims its namespace (`ray_namespace`, default `sluice`;
engine/ray_claim.py): another live plane's namespace is refused. Each Ray node gets one
detached actor named `sluice-agent-<node id>` in that namespace, pinned to it with a hard
node-affinity strategy; inside it the same `NodeAgent` as the local engine runs the job
processes (kernel CPU limits, progress tailing, logs). Because the actors are detached, a
killed control plane leaves them and their jobs running; the next one finds them by name and adopts the jobs.

Job processes are not Ray tasks: sluice does its own CPU accounting with kernel limits,
so the agent actor asks Ray for no CPU (`num_cpus=0`).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice.agent.faults import FaultReport
from sluice.agent.launchenv import gang_env, sized_as_a_gang
from sluice.agent.netif import NET_IP_LABEL, interface_ipv4
from sluice.data.warm import WarmReport
from sluice.engine.base import pick_nodes
from sluice.engine.ray_connect import check_reachable, resolve_address
from sluice.engine.ray_errors import brief
from sluice.engine.ray_gang import GangBook, Stop, parse_replica
from sluice.engine.ray_membership import Membership, RayNode
from sluice.engine.run_folders import remove_job_folders
from sluice.model import (
    Allocation,
    EngineCapabilities,
    Event,
    JobExited,
    JobProgress,
    JobStarted,
    JobUser,
    LaunchRequest,
    NodeInfo,
    NodeLost,
    NodeUp,
)

if TYPE_CHECKING:
    from sluice.settings import Settings

log = logging.getLogger("sluice.engine.ray")

NAMESPACE = "sluice"
AGENT_PREFIX = "sluice-agent-"
CLAIM_RENEW_S = 10.0
"""How often the plane renews its record in the namespace's claim actor (engine/ray_claim.py)."""
AGENT_MEMORY_LABEL = "memory-limits"
"""The label each node agent sets to its memory controller (cgroup-v1, cgroup-v2 or none)."""
AGENT_NET_LABEL = NET_IP_LABEL
"""The label each node agent sets, when `net_interface` is set, to that interface's IPv4 address
on its node ("none" without one): the engine compares it with the address Ray advertises."""


def _retell_and_config() -> Callable[[Any], Any]:
    """What a found agent actor runs through `__ray_call__`: have its NodeAgent tell its last
    poll's exits again, where it can (an older agent cannot: nothing to do), and give what it
    was created with. Made here so that Ray ships the function's code with the call (a nested
    function goes by value): an agent an older sluice made has no such function to import."""

    def run(actor: Any) -> Any:
        retell = getattr(getattr(actor, "_agent", None), "retell", None)
        if callable(retell):
            retell()
        return getattr(actor, "_created_with", None)

    return run


def _unfinished(agent: Any) -> Any:
    """An ObjectRef to the job (replica) ids of the attempts `agent` has not finished. Asked
    through Ray's generic call: an agent an older sluice made has no `unfinished`, and calling
    a method its class lacks kills the actor's worker and its jobs with it; such an agent
    answers with the jobs whose processes it sees running (`alive`), what it had then."""
    return agent.__ray_call__.remote(lambda a: a.unfinished() if hasattr(a, "unfinished") else sorted(a.alive()))


class RayEngine:
    """Engine over a Ray cluster. See the module docstring for the design."""

    name = "ray"
    logs_per_replica = True
    """Each replica of a gang logs on its own node (`replica_log`), not into one job log."""
    capabilities = EngineCapabilities(
        live_cpu_resize=True,  # each replica's agent changes its kernel CPU limit in place
        gang_launch=True,  # replicas start together on their nodes or not at all (ray_gang)
        migration=True,
        node_kpis=True,
        job_progress=True,
        measured_throughput=True,
        max_replicas=256,
        # Every replica runs under its node agent's shim in that node's memory cgroup. Each
        # agent labels its node memory-limits=<cgroup-v1|cgroup-v2|none> (merged into the node's labels
        # when it first answers), so the plane refuses memory_mb at submit when no node can
        # enforce it; a node without a controller also refuses to launch such a job.
        memory_limits=True,
    )

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        shared_root: str | Path | None = None,
        address: str | None = None,
        namespace: str | None = None,
        membership_interval_s: float = 1.0,
        call_timeout_s: float = 30.0,
        poll_wait_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Join the Ray cluster at `address` (None: start a local one owned by this process).

        shared_root: a folder every Ray node reaches; job runs (logs, progress) go under
        `runs/nodes/<node>` and checkpoints under `checkpoints/`, so an attempt can resume
        on any node. Arguments override the settings they name.
        """
        import ray

        from sluice.settings import Settings

        conf = settings or Settings()
        self._ray = ray
        self.namespace = namespace or conf.ray_namespace
        # No address means a fresh instance ("local"), never whatever cluster Ray would find;
        # RAY_ADDRESS is honoured only as an address joined and said so (ray_connect).
        address, source = resolve_address(address or conf.ray_address)
        self.address = address
        """The cluster joined (None: the one-node instance this process started)."""
        self.address_source = source
        """Where `address` came from: "ray_address", "RAY_ADDRESS" or "" (none)."""
        self.owned = False
        """True when this process started the Ray instance: it (and its jobs) stop with it."""
        self.net_interface = conf.net_interface
        if not ray.is_initialized():
            bind: dict[str, Any] = {}
            if address is None:
                if conf.net_interface:
                    # The node sluice starts is bound to the chosen interface, as `ray start
                    # --node-ip-address` would: Ray's traffic and every gang's MASTER_ADDR use it.
                    # No usable address refuses the start (NetInterfaceUnavailable, with the reason).
                    bind["_node_ip_address"] = interface_ipv4(conf.net_interface)
                    log.info("Ray node bound to net_interface %s (%s)", conf.net_interface, bind["_node_ip_address"])
                log.warning(
                    "no Ray address given: starting a one-node Ray instance owned by this process; its jobs "
                    "stop with it. Start a cluster (`ray start --head`) and pass its address to let jobs "
                    "outlive the control plane."
                )
            else:
                log.info(
                    "joining the Ray cluster at %s%s", address, " (from RAY_ADDRESS)" if source == "RAY_ADDRESS" else ""
                )
                check_reachable(address)  # RayUnreachable within seconds instead of ray.init's retries
            ray.init(
                address=address or "local",
                namespace=self.namespace,
                log_to_driver=False,
                configure_logging=False,
                **bind,
            )
            self.owned = address is None
        root = Path(shared_root or conf.ray_shared_root or conf.home)
        self.runs_root = root / "runs"
        self.checkpoint_root: str | None = str(root / "checkpoints")
        """Read by the control plane: where the controller puts every job's checkpoints."""
        self.agent_settings = agent_settings_from(conf)
        """Settings fields every node's agent runs with (grace period, sample intervals...)."""
        self.agent_cache = conf.cache.model_dump(mode="json")
        """The plane's node-cache settings (folders from its home): every node's agent caches
        there unless its raylet's SLUICE_CACHE_* variables say otherwise (agent/ray_actor.py)."""
        self.membership_interval_s = membership_interval_s
        self.call_timeout_s = call_timeout_s
        """Longest wait for an agent's answer where the engine cannot go on without it (s)."""
        self.poll_wait_s = poll_wait_s
        """Longest wait for the agents' poll answers in one round; late ones come next round (s)."""
        self._clock = clock
        self._membership = Membership()
        self._agents: dict[str, Any] = {}
        """node name -> actor handle of its agent."""
        self._gangs = GangBook()
        self._pending: list[Event] = []
        """Events made by the engine itself (node changes, node-lost exits), not yet polled."""
        self._inflight: dict[str, Any] = {}
        """node name -> ObjectRef of a poll not yet answered (kept so no event is dropped)."""
        self._agent_labels: dict[str, dict[str, str]] = {}
        """node name -> what its agent knows of its node and Ray's list does not (e.g. whether
        it can enforce memory limits), merged into the node's labels once the agent answers."""
        self._label_asks: dict[str, Any] = {}
        """node name -> ObjectRef of the agent's info() not yet answered."""
        self._last_sync = float("-inf")
        self._net_warned: set[str] = set()
        """Nodes already warned about not being bound to `net_interface` (once per node)."""
        self._unreachable: set[str] = set()
        self._log_paths: dict[str, str] = {}
        self._timing: dict[str, dict[str, float]] = {}
        from sluice.agent.ray_actor import RayNodeAgent
        from sluice.engine.ray_claim import Claim

        self._actor_cls = ray.remote(RayNodeAgent)
        self._claim: Claim | None = None
        try:  # before any agent is touched: another plane's agents are not ours to adopt or kill
            self._claim = Claim(ray, self.namespace, Path(conf.home))
        except Exception:
            self.close()
            raise
        self._next_hold = self._clock() + CLAIM_RENEW_S
        self._sync(force=True)

    # ----------------------------------------------------------------- membership

    def _sync(self, force: bool = False) -> None:
        """Diff Ray's membership; start agents on new nodes, fail jobs of lost ones."""
        now = self._clock()
        if not force and now - self._last_sync < self.membership_interval_s:
            return
        self._last_sync = now
        changes = self._membership.update(self._ray.nodes(), now)
        for e in changes:
            if isinstance(e, NodeLost):
                self._agents.pop(e.node, None)
                self._inflight.pop(e.node, None)
                self._label_asks.pop(e.node, None)
                self._agent_labels.pop(e.node, None)
                exits, stops = self._gangs.node_lost(e.node, now)
                for x in exits:
                    if isinstance(x, JobExited):
                        self._timing.setdefault(x.job_id, {})["lost_at"] = now
                self._pending += [e, *exits]
                self._kill(stops)
        for name, node in self._membership.nodes.items():
            if name not in self._agents:
                self._agents[name] = self._agent_for(node)
                self._label_asks[name] = self._agents[name].info.remote()
        self._pending += [e for e in changes if not isinstance(e, NodeLost)]

    def _collect_labels(self) -> list[Event]:
        """Labels the agents answered since the last round, as NodeUp updates of their nodes:
        the control plane then knows, at submit, which nodes can enforce `memory_mb`."""
        if not self._label_asks:
            return []
        ready, _ = self._ray.wait(list(self._label_asks.values()), num_returns=len(self._label_asks), timeout=0)
        done = set(ready)
        out: list[Event] = []
        for name, ref in list(self._label_asks.items()):
            if ref not in done:
                continue
            del self._label_asks[name]
            try:
                info = self._ray.get(ref)
            except Exception:  # the agent is restarting or its node dying: membership will tell
                continue
            node = self._membership.nodes.get(name)
            if node is None:
                continue
            self._agent_labels[name] = {AGENT_MEMORY_LABEL: info.labels.get(AGENT_MEMORY_LABEL, "none")}
            if AGENT_NET_LABEL in info.labels:
                self._agent_labels[name][AGENT_NET_LABEL] = info.labels[AGENT_NET_LABEL]
                self._check_net(node, info.labels[AGENT_NET_LABEL])
            merged = {**node.labels, **self._agent_labels[name]}
            out.append(NodeUp(name, self._clock(), node.cpu, node.gpus, node.memory_mb, merged))
        return out

    def _check_net(self, node: RayNode, iface_ip: str) -> None:
        """Warn once per node whose Ray address is not its `net_interface` address: sluice binds
        only the Ray node it starts; nodes of an existing cluster are bound by whoever starts
        them (`ray start --node-ip-address`), and until then their traffic, and the
        MASTER_ADDR of gangs placed there, use whatever address Ray picked."""
        if node.name in self._net_warned or iface_ip == node.address:
            return
        self._net_warned.add(node.name)
        if iface_ip == "none":
            log.warning(
                "node %s: net_interface %s has no usable IPv4 address there; Ray's traffic to it uses %s",
                node.name, self.net_interface, node.address,
            )  # fmt: skip
        else:
            log.warning(
                "node %s: Ray advertises %s, not %s on net_interface %s; Ray's traffic and gang rendezvous "
                "there bypass the chosen interface. Restart that node with `ray start --node-ip-address=%s ...`",
                node.name, node.address, iface_ip, self.net_interface, iface_ip,
            )  # fmt: skip

    def _agent_for(self, node: RayNode) -> Any:
        """The node's agent, made with this plane's runs folder and settings. A detached agent
        found by name keeps what the plane that created it gave it (a `job_python` or a fence
        changed since would be ignored there): one that differs is replaced when it has nothing
        running, else kept, and the differing fields logged."""
        try:
            agent = self._ray.get_actor(AGENT_PREFIX + node.node_id, namespace=self.namespace)
        except ValueError:  # none yet: made with this plane's
            return self._make_agent(node)
        want = self._agent_config(node)
        try:
            # Through Ray's generic call, not a method: calling a method its class lacks (an
            # agent of an older sluice) kills the actor's worker, and with it its jobs. The same
            # call has the agent tell its last poll's exits again: that answer may have died
            # with the plane before it stored them (NodeAgent.retell).
            have = self._get(agent.__ray_call__.remote(_retell_and_config())) or {}
        except Exception as err:  # restarting, or its node dying: membership will tell
            why = brief(err)
            log.warning("node %s: cannot ask its agent what it was created with (%s); keeping it", node.name, why)
            return agent
        differ = config_diff(have, want)
        if not differ:
            return agent
        try:
            busy = self._get(_unfinished(agent))
        except Exception as err:
            log.warning("node %s: cannot ask its agent for its jobs (%s); keeping it", node.name, brief(err))
            return agent
        if busy:
            log.warning(
                "node %s: its agent was created with another %s than this plane's and has %d unfinished "
                "job(s), so it is kept, and launches with its own until a plane starts while it has none",
                node.name, ", ".join(differ), len(busy),
            )  # fmt: skip
            return agent
        log.info("node %s: replacing its agent, created with another %s", node.name, ", ".join(differ))
        with contextlib.suppress(Exception):  # what it made on the host goes with it
            self._get(agent.close.remote())
        self._ray.kill(agent, no_restart=True)
        self._await_name_free(AGENT_PREFIX + node.node_id)
        return self._make_agent(node)

    def _agent_config(self, node: RayNode) -> dict[str, Any]:
        return {
            "runs_dir": str(self.runs_root / "nodes" / node.name),
            "settings": self.agent_settings,
            "cache": self.agent_cache,
        }

    def _await_name_free(self, name: str) -> None:
        """Until Ray has released a killed actor's name (a get_if_exists before would find it)."""
        deadline = time.monotonic() + self.call_timeout_s
        while time.monotonic() < deadline:
            try:
                self._ray.get_actor(name, namespace=self.namespace)
            except ValueError:
                return
            time.sleep(0.1)

    def _make_agent(self, node: RayNode) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return self._actor_cls.options(
            name=AGENT_PREFIX + node.node_id,
            namespace=self.namespace,
            lifetime="detached",
            get_if_exists=True,
            max_restarts=-1,
            num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
        ).remote(
            node.name,
            node.cpu,
            gpus=node.gpus,
            memory_mb=node.memory_mb,
            labels=node.labels,
            **self._agent_config(node),
        )

    def _get(self, ref: Any) -> Any:
        return self._ray.get(ref, timeout=self.call_timeout_s)

    def _agent(self, node: str) -> Any:
        agent = self._agents.get(node)
        if agent is None:
            raise ValueError(f"node {node!r} is not a live node of the Ray cluster")
        return agent

    # ----------------------------------------------------------------- Engine protocol

    def nodes(self) -> list[NodeInfo]:
        self._sync()
        out = []
        for n in self._membership.nodes.values():
            if n.name in self._agents:
                info = n.info()
                info.labels.update(self._agent_labels.get(n.name, {}))
                out.append(info)
        return out

    def launch(self, req: LaunchRequest) -> None:
        self._sync()
        nodes = [a.node for a in req.allocation.assignments]
        agents = [self._agent(n) for n in nodes]  # all or nothing: fail before starting any
        env = dict(req.env)
        world = len(nodes)
        as_gang = world > 1 or sized_as_a_gang(req)  # an elastic job at one replica too
        master_addr, master_port = "", 0
        if as_gang:
            master_addr = str(self._get(agents[0].address.remote()))
            master_port = int(self._get(agents[0].free_port.remote()))
        replicas = self._gangs.open(req.job_id, req.attempt, nodes)
        t = self._timing.setdefault(req.job_id, {})
        t["launched_at"] = self._clock()
        for rank, ((rid, _node), agent, assignment) in enumerate(
            zip(replicas, agents, req.allocation.assignments, strict=True)
        ):
            renv = dict(env)
            if as_gang:
                # The same torchrun variables as the local engine's gangs: one Ray node is
                # one of torchrun's groups.
                renv.update(gang_env(rank, nodes, master_addr, master_port))
            sub = LaunchRequest(
                job_id=rid,
                attempt=req.attempt,
                tenant=req.tenant,
                spec=req.spec,
                allocation=Allocation((assignment,)),
                checkpoint_dir=req.checkpoint_dir,
                env=renv,
                run_as=req.run_as,  # the raylet's agent switches to it when it runs as root
            )
            agent.launch.remote(sub)
        self._log_paths.pop(req.job_id, None)

    def resize(self, job_id: str, attempt: int, allocation: Allocation) -> None:
        replicas = self._gangs.replicas(job_id, attempt)
        if not replicas:
            raise ValueError(f"job {job_id} attempt {attempt} is not running on this engine")
        for rank, (rid, node) in enumerate(replicas):
            a = allocation.assignments[min(rank, len(allocation.assignments) - 1)]
            mine = Allocation.single(node, a.cpu_request, a.cpu_limit, a.gpus)
            self._get(self._agent(node).resize.remote(rid, attempt, mine))

    def stop(self, job_id: str, attempt: int, checkpoint: bool = True) -> None:
        t = self._timing.setdefault(job_id, {})
        t["stop_at"] = self._clock()
        replicas = self._gangs.replicas(job_id, attempt)
        if replicas:
            for rid, node in replicas:
                agent = self._agents.get(node)
                if agent is not None:
                    agent.stop.remote(rid, attempt, checkpoint)
            return
        for agent in self._agents.values():  # unknown here: ask every agent (it ignores strangers)
            agent.stop.remote(job_id, attempt, checkpoint)

    def poll(self) -> list[Event]:
        self._sync()
        if self._claim is not None and self._clock() >= self._next_hold:
            self._next_hold = self._clock() + CLAIM_RENEW_S
            self._claim.hold()
        for name, agent in self._agents.items():
            if name not in self._inflight:
                self._inflight[name] = agent.poll.remote()
        refs = list(self._inflight.values())
        # A short wait: an agent on a dying node must not hold up the round for the others.
        ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=self.poll_wait_s)
        done = set(ready)
        events, self._pending = self._pending, []
        events += self._collect_labels()
        for name, ref in list(self._inflight.items()):
            if ref not in done:
                continue  # a slow agent: its answer is collected next round
            del self._inflight[name]
            try:
                batch = self._ray.get(ref)
            except Exception as err:  # actor restarting or its node dying: membership will tell
                if name not in self._unreachable:  # say it once, not every round
                    log.warning("the agent on %s does not answer (%s); waiting for Ray's verdict", name, brief(err))
                    self._unreachable.add(name)
                continue
            self._unreachable.discard(name)
            for e in batch:
                out, stops = self._gangs.translate(e, name)
                events += out
                self._kill(stops)
        self._note_timing(events)
        return events

    def clock(self) -> float:
        return self._clock()

    def alive(self) -> dict[str, int]:
        self._sync(force=True)
        names = list(self._agents)
        answers = self._ray.get([self._agents[n].alive.remote() for n in names], timeout=self.call_timeout_s)
        out: dict[str, int] = {}
        for name, found in zip(names, answers, strict=True):
            for rid, attempt in found.items():
                job_id = self._gangs.adopt(rid, attempt, name)
                out[job_id] = max(attempt, out.get(job_id, 0))
        return out

    def log_path(self, job_id: str) -> str | None:
        if job_id in self._log_paths:
            return self._log_paths[job_id]
        rid, node = self._gangs.rank0.get(job_id, (job_id, ""))
        agent = self._agents.get(node)
        if agent is None:
            return self._newest_log_on_disk(job_id)
        path = str(self._get(agent.log_path.remote(rid)))
        self._log_paths[job_id] = path
        return path

    def _logs_on_disk(self, job_id: str) -> list[Path]:
        """Every log of the job in the shared runs folder (one per node it ran on; rank 0's
        for a gang), oldest write first."""
        jid = glob.escape(job_id)
        found = [*self.runs_root.glob(f"nodes/*/{jid}/job.log"), *self.runs_root.glob(f"nodes/*/{jid}--r0of*/job.log")]
        dated = []
        for p in found:
            with contextlib.suppress(OSError):  # its node's folder went away meanwhile
                dated.append((p.stat().st_mtime, str(p), p))
        return [p for _, _, p in sorted(dated)]

    def _newest_log_on_disk(self, job_id: str) -> str | None:
        """A job this engine did not launch (finished before a restart, or its node is gone):
        its newest log in the shared runs folder, rank 0's for a gang."""
        found = self._logs_on_disk(job_id)
        return str(found[-1]) if found else None

    def replica_log(self, job_id: str, rank: int) -> str | None:
        """Replica `rank`'s log of the job's newest gang (`<job>--r<k>of<N>` on the node it ran
        on); a job of one replica has only its own log, rank 0's. Read from the shared runs
        folder, so a finished job's and a lost node's logs are found too."""
        jid = glob.escape(job_id)
        found = []
        for p in self.runs_root.glob(f"nodes/*/{jid}--r{int(rank)}of*/job.log"):
            with contextlib.suppress(OSError):
                found.append((p.stat().st_mtime, str(p)))
        if found:
            return max(found)[1]
        return self.log_path(job_id) if rank == 0 else None

    def replica_logs(self, job_id: str, world: int) -> list[str | None]:
        """`replica_log` of ranks 0..world-1, from one listing of the runs folder: asked rank by
        rank, a gang of 1,024 replicas (what any tenant may submit, queued or not) cost 1,024
        listings a request, seconds of the API's CPU, and again every poll of a followed view
        (red team s22)."""
        jid = glob.escape(job_id)
        newest: dict[int, tuple[float, str]] = {}
        prefix = f"{job_id}--r"
        for p in self.runs_root.glob(f"nodes/*/{jid}--r*of*/job.log"):
            rank_text, of, _ = p.parent.name[len(prefix) :].partition("of")
            if not of or not rank_text.isdigit() or int(rank_text) >= world:
                continue
            with contextlib.suppress(OSError):
                seen = (p.stat().st_mtime, str(p))
                newest[int(rank_text)] = max(newest.get(int(rank_text), seen), seen)
        found: list[str | None] = [newest[k][1] if k in newest else None for k in range(world)]
        if world and found[0] is None:
            found[0] = self.log_path(job_id)
        return found

    def earlier_logs(self, job_id: str) -> list[str]:
        """The logs a moved job's earlier attempts left on other nodes (`job logs` showed only
        the newest node's, walkthrough 4), oldest first."""
        current = self.log_path(job_id)
        newest = Path(current).resolve() if current else None
        return [str(p) for p in self._logs_on_disk(job_id) if p.resolve() != newest]

    def run_folder(self, job_id: str, rank: int = 0) -> str | None:
        """The folder of replica `rank`'s newest log in the shared runs folder (rank 0's is the
        job's: `nodes/<node>/<job>` or a gang's `<job>--r0of<N>`)."""
        log = self.replica_log(job_id, rank)
        return str(Path(log).parent) if log else None

    def still_running(self, job_ids: Collection[str]) -> list[str]:
        """Asked of every node's agent at once; a node that does not answer within
        `call_timeout_s` is passed over (logged): its raylet's fence kills its jobs when Ray
        loses it, and its folders lie in the shared runs folder either way."""
        wanted = set(job_ids)
        asks = {_unfinished(self._agents[n]): n for n in list(self._agents)}
        ready, late = self._ray.wait(list(asks), num_returns=len(asks), timeout=self.call_timeout_s)
        if late:
            log.warning("still_running: no answer from node(s) %s", ", ".join(sorted(asks[r] for r in late)))
        found: set[str] = set()
        for ref in ready:
            try:
                found.update(parse_replica(rid)[0] for rid in self._ray.get(ref, timeout=0))
            except Exception as err:
                log.warning("still_running: node %s: %s", asks[ref], brief(err))
        return sorted(found & wanted)

    def remove_run_folders(self, job_id: str) -> int:
        """The job's folders on every node's part of the shared runs folder, and its checkpoint
        folder under the shared checkpoint root. What the engine kept of the job in memory goes too."""
        self._log_paths.pop(job_id, None)
        self._timing.pop(job_id, None)
        self._gangs.forget(job_id)
        gone = 0
        with contextlib.suppress(FileNotFoundError):
            for node_dir in (self.runs_root / "nodes").iterdir():
                if node_dir.is_dir() and not node_dir.is_symlink():
                    gone += remove_job_folders(node_dir, job_id)
        if self.checkpoint_root is not None:
            gone += remove_job_folders(Path(self.checkpoint_root), job_id)
        return gone

    def close(self) -> None:
        """Disconnect; the detached agents and their jobs keep running — except on a one-node
        instance this process started (`owned`), which stops with it: its agents are closed
        first, so that what they made on the host (the node's nft counter table, its empty
        groups) goes with them rather than waiting for the next agent's sweep."""
        self._inflight.clear()
        claim, self._claim = getattr(self, "_claim", None), None
        if claim is not None and self._ray.is_initialized():
            claim.release()
        if self.owned and self._ray.is_initialized():
            refs = [agent.close.remote() for agent in dict(self._agents).values()]
            try:
                self._ray.get(refs, timeout=self.call_timeout_s)
            except Exception as err:  # the instance stops anyway; the next agent sweeps what is left
                log.warning("closing the node agents of the Ray instance this plane started: %s", brief(err))
        if self._ray.is_initialized():
            self._ray.shutdown()

    # ----------------------------------------------------------------- dataset caches

    def warm_dataset(
        self,
        name: str,
        source: str,
        storage_options: Mapping[str, Any] | None = None,
        nodes: list[str] | None = None,
        workers: int = 16,
        generation: str = "",
        run_as: JobUser | None = None,
        check_s: float = 1.0,
    ) -> list[WarmReport]:
        """Warm the dataset in the cache of every node (or `nodes`) through its agent actor,
        all nodes at once. Each actor warms in a thread of its own and is asked every
        `check_s` whether it is done, so its poll() answers stay prompt meanwhile. A node lost
        or an actor restarted mid-warm is reported as that node's error."""
        agents = dict(self._agents)  # a snapshot: the control loop may change the map meanwhile
        names = pick_nodes(nodes, agents)
        opts = dict(storage_options or {})
        reports: dict[str, WarmReport] = {}
        tickets: dict[str, str] = {}
        for n in names:
            try:
                tickets[n] = self._get(agents[n].warm_start.remote(name, source, opts, workers, generation, run_as))
            except Exception as err:
                reports[n] = _failed(n, f"could not start the warm: {brief(err)}")
        while tickets:
            refs = {n: agents[n].warm_result.remote(t, check_s) for n, t in tickets.items()}
            for n, ref in refs.items():
                try:
                    done = self._get(ref)
                except Exception as err:  # actor restarting or its node dying
                    reports[n] = _failed(n, f"the node's agent stopped answering: {brief(err)}")
                    tickets.pop(n)
                    continue
                if done is not None:
                    reports[n] = done
                    tickets.pop(n)
        return [reports[n] for n in names]

    def drop_dataset(self, name: str, owner: JobUser | None = None) -> dict[str, str]:
        agents = dict(self._agents)
        refs = {n: a.drop_dataset.remote(name, owner) for n, a in agents.items()}
        out: dict[str, str] = {}
        for n, ref in refs.items():
            try:
                out[n] = "removed" if self._get(ref) else "not cached"
            except Exception as err:  # a node dying or its actor restarting: say so, go on
                out[n] = f"the node's agent did not answer: {brief(err)}"
        return out

    def inject_fault(
        self, node: str, kind: str, seconds: float, workers: int | None = None, memory_mb: int = 512
    ) -> FaultReport:
        """Through the node's agent actor: the fault runs on that Ray node, pinned to its cores."""
        agent = self._agents[node]
        report: FaultReport = self._get(agent.inject_fault.remote(kind, seconds, workers, memory_mb))
        return report

    def stop_faults(self, node: str) -> int:
        return int(self._get(self._agents[node].stop_faults.remote()))

    # ----------------------------------------------------------------- extras the controller reads

    def job_hints(self, job_id: str) -> dict[str, Any]:
        """Where the job runs and how long its last move (migration or recovery) took."""
        t = self._timing.get(job_id, {})
        out: dict[str, Any] = {}
        if job_id in self._gangs.rank0:
            out["ray_node"] = self._gangs.rank0[job_id][1]
        for key in ("last_move_s", "last_recovery_s", "resumed_at"):
            if key in t:
                out[key] = t[key]
        if "progress_attempt" in t:
            out["reporting_attempt"] = int(t["progress_attempt"])
        return out

    def ray_node_id(self, node: str) -> str | None:
        n = self._membership.nodes.get(node)
        return n.node_id if n is not None else None

    # ----------------------------------------------------------------- helpers

    def _kill(self, stops: list[Stop]) -> None:
        for node, rid, attempt in stops:
            agent = self._agents.get(node)
            if agent is not None:
                agent.stop.remote(rid, attempt, False)

    def _note_timing(self, events: list[Event]) -> None:
        """Time from a stop (or a node loss) to the first progress of the next attempt."""
        for e in events:
            if isinstance(e, JobStarted):
                self._timing.setdefault(e.job_id, {})["started_at"] = e.time
            elif isinstance(e, JobProgress):
                t = self._timing.get(e.job_id)
                if t is None or t.get("progress_attempt") == e.attempt:
                    continue
                t["progress_attempt"] = e.attempt
                t["resumed_at"] = e.time
                if "stop_at" in t and t.get("launched_at", 0.0) >= t["stop_at"]:
                    t["last_move_s"] = round(e.time - t.pop("stop_at"), 3)
                if "lost_at" in t:
                    t["last_recovery_s"] = round(e.time - t.pop("lost_at"), 3)
            elif isinstance(e, JobExited):
                self._log_paths.pop(e.job_id, None)


def _failed(node: str, why: str) -> WarmReport:
    return WarmReport(node, 0, 0, 0, 0.0, 0.0, why)


AGENT_SETTINGS = (
    "stop_grace_s",
    "usage_sample_s",
    "kpi_sample_s",
    "cgroup_root",
    "job_python",
    "job_max_open_files",
    "job_max_processes",
    "job_max_file_mb",
    "job_core_dumps",
    "dataset_roots",
    "checkpoint_roots",
    "allow_source_hosts",
    "net_interface",
    "gpu_fence",
    "net_fence",
    "unix_fence",
    "disk_check_s",
    "disk_reserve_percent",
)
"""The settings fields that shape what a node agent does (the plane's win over a node's own
SLUICE_* environment: without the fences here, a plane's `*_fence: off` was ignored on Ray)."""


def config_diff(have: Mapping[str, Any], want: Mapping[str, Any]) -> list[str]:
    """What differs between an agent's creation arguments (`created_with`) and a plane's:
    `runs_dir`, each differing setting by name, `cache`. Everything, for an agent that cannot
    say (`have` empty)."""
    if not have:
        return ["settings (an agent that cannot say which)"]
    out = ["runs_dir (ray_shared_root)"] if have.get("runs_dir") != want.get("runs_dir") else []
    mine, theirs = want.get("settings") or {}, have.get("settings") or {}
    out += [k for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
    if have.get("cache") != want.get("cache"):
        out.append("cache")
    return out


def agent_settings_from(settings: Settings) -> dict[str, Any]:
    """The NodeAgent knobs that travel to every node's actor (plain values only)."""
    return {k: getattr(settings, k) for k in AGENT_SETTINGS}
