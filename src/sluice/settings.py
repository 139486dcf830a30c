"""Typed settings. Every field: meaning, unit, default. Set through SLUICE_* environment
variables (e.g. SLUICE_POLICY=kube) or a `settings.yaml` in $SLUICE_HOME.

This module imports nothing else of sluice but the cache's own settings (sluice.data.settings,
which imports nothing of sluice), so every part may read it.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings import SettingsError as PydanticSettingsError

from sluice.data.guard import parse_allow_entry
from sluice.data.settings import CacheSettings


def _default_home() -> Path:
    return Path.home() / ".sluice"


MAX_ALLOW_SOURCE_HOSTS = 1000
"""Entries in `allow_source_hosts`: each is checked on every fetch a tenant causes."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SLUICE_", extra="ignore", allow_inf_nan=False)
    """No setting is infinite or NaN: an infinite KPI period silently stops health sampling, an
    infinite grace holds every alarm for ever (walkthrough 4)."""

    home: Annotated[Path, Field(description="State folder: database, job runs, logs, tokens. Default ~/.sluice.")] = (
        _default_home()
    )
    database_url: Annotated[
        str | None,
        Field(description="SQLAlchemy URL (sqlite:///… or postgresql://…). Default: SQLite in home."),
    ] = None
    host: Annotated[str, Field(description="API bind address. Default 127.0.0.1 (loopback only).")] = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535, description="API port. Default 8765; 0 picks a free one.")] = 8765
    policy: Annotated[str, Field(description="Scheduling policy name. Default flowcon.")] = "flowcon"
    engine: Annotated[Literal["local", "ray"], Field(description="Engine: local or ray. Default local.")] = "local"
    ray_address: Annotated[str | None, Field(description="Ray cluster address for engine=ray; None starts one.")] = None
    ray_namespace: Annotated[
        str, Field(description="Ray namespace of sluice's detached node-agent actors (engine=ray). Default sluice.")
    ] = "sluice"
    ray_shared_root: Annotated[
        str | None,
        Field(
            description="Folder every Ray node can reach (a shared mount) for checkpoints, job runs and logs "
            "under engine=ray. Default: home (right when all Ray nodes share this machine)."
        ),
    ] = None
    allow_unschedulable: Annotated[
        bool,
        Field(
            description="Accept jobs that no current node can hold; they wait with a reason starting "
            "`Unschedulable:` until the cluster grows. Turn on for a Ray cluster with autoscaling (or KubeRay). "
            "Default false: such jobs are refused at submit with the largest node's size."
        ),
    ] = False
    reconcile_interval_s: Annotated[
        float,
        Field(
            gt=0, le=60, description="Seconds between reconcile rounds (poll, decide, act). Default 0.5; at most 60."
        ),
    ] = 0.5
    policy_interval_s: Annotated[
        float,
        Field(gt=0, description="FlowCon's control interval Δ in seconds: how often CPU is re-allocated. Default 10."),
    ] = 10.0
    stop_grace_s: Annotated[
        float,
        Field(
            gt=0,
            le=86_400,
            description="Seconds between SIGTERM and SIGKILL when stopping a job. Default 20; at most a day.",
        ),
    ] = 20.0
    restart_backoff_s: Annotated[
        float, Field(ge=0, description="Base back-off before a failed job is retried; doubles per restart. Default 2.")
    ] = 2.0
    preempt_min_runtime_s: Annotated[
        float,
        Field(
            ge=0,
            description="Admission never preempts a job placed less than this many seconds ago "
            "(no thrashing). Default 60.",
        ),
    ] = 60.0
    virtual_nodes: Annotated[
        int, Field(ge=1, le=64, description="Split this machine into N virtual nodes (cpusets). Default 1.")
    ] = 1
    node_cpus: Annotated[
        float | None, Field(gt=0, description="Cores per node offered to jobs. Default: all cores / virtual_nodes.")
    ] = None
    cgroup_root: Annotated[
        str | None,
        Field(
            description="Name of the folder, in each cgroup controller, that holds this plane's node and job "
            "cgroups. Default: detected (`sluice`). A second plane on one host needs one of its own: two planes "
            "with one node name would share (and remove) each other's groups, so the second is refused."
        ),
    ] = None
    usage_sample_s: Annotated[
        float, Field(gt=0, le=3600, description="Seconds between CPU-usage samples of jobs. Default 1; at most 3600.")
    ] = 1.0
    kpi_sample_s: Annotated[
        float, Field(gt=0, le=3600, description="Seconds between node KPI samples. Default 1; at most 3600.")
    ] = 1.0
    health_enabled: Annotated[bool, Field(description="Run the node anomaly detector. Default false.")] = False
    health_train_samples: Annotated[
        int,
        Field(
            ge=20,
            le=86_400,
            description="KPI samples a node must show before its detector is fitted (each is kept until then). "
            "Default 300; at most 86400.",
        ),
    ] = 300
    health_q: Annotated[
        float, Field(gt=0, lt=0.5, description="SPOT risk: chance a healthy score passes the threshold. Default 1e-3.")
    ] = 1e-3
    health_threshold: Annotated[
        Literal["spot", "dspot"],
        Field(
            description="How a node's anomaly scores become alarms: dspot (drift-aware: a threshold on the score's "
            "excess over the mean of the newest non-alarm scores) or spot (a threshold on the score itself). "
            "Default dspot.",
        ),
    ] = "dspot"
    health_dspot_depth: Annotated[
        int,
        Field(
            ge=1,
            le=3600,
            description="dspot: how many of the newest non-alarm scores make a node's level (samples). Default 100.",
        ),
    ] = 100
    health_change_grace_s: Annotated[
        float,
        Field(
            ge=0,
            le=3600,
            description="Seconds a node's health alarms are held after the control plane changes what runs there "
            "(job placed, stopped, moved, resized; checkpoint). Default 20; at most 3600.",
        ),
    ] = 20.0
    health_retrain_growth: Annotated[
        float,
        Field(
            ge=0,
            description="Refit a node's health model when its healthy history has grown by this factor "
            "(0 = never). Default 2.",
        ),
    ] = 2.0
    health_history_samples: Annotated[
        int,
        Field(ge=20, le=86_400, description="Healthy KPI samples kept per node for refits. Default 1800 (30 min)."),
    ] = 1800
    isolation: Annotated[
        Literal["auto", "on", "off"],
        Field(
            description="Tenant isolation: run each tenant's jobs as its own unprivileged uid (see docs/security.md). "
            "auto: on when the control plane may switch users (root, or CAP_SETUID/SETGID/CHOWN/DAC_OVERRIDE/"
            "FOWNER/KILL), off otherwise; on: refuse to start without that privilege; off: jobs run as the plane's "
            "own user and a second tenant needs `sluice tenant create --force`. Default auto.",
        ),
    ] = "auto"
    gpu_fence: Annotated[
        Literal["auto", "off"],
        Field(
            description="Keep each job off the GPUs it was not given, in the kernel (docs/security.md): auto: "
            "a device cgroup per job where the node has one (cgroup v1 devices, or a cgroup v2 device program); "
            "a job with no GPU is refused every NVIDIA device, and a job's CUDA_VISIBLE_DEVICES then counts "
            "its GPUs from 0 (SLUICE_GPUS names the machine's). off: no fence; any job can open any GPU of "
            "its node. Default auto.",
        ),
    ] = "auto"
    net_fence: Annotated[
        Literal["auto", "off"],
        Field(
            description="Keep one tenant's jobs from connecting to another tenant's jobs' sockets on the same "
            "machine (docs/security.md): auto: nftables rules per job where jobs have cgroup v2 groups and nft is "
            "installed (isolation on only: without it every job is one uid). off: any job can connect to any "
            "job's sockets. Default auto.",
        ),
    ] = "auto"
    unix_fence: Annotated[
        Literal["auto", "off"],
        Field(
            description="Keep a tenant's job from connecting to abstract Unix sockets it did not make, another "
            "tenant's jobs' among them, and from ptracing processes outside it (docs/security.md): auto: a Landlock "
            "domain per job where the kernel has Landlock scopes (Linux 6.12+; isolation on only). A job's own "
            "children share its domain; two replicas of a gang do not (they meet over TCP). off: any job can "
            "connect to any abstract Unix socket on its machine. Default auto.",
        ),
    ] = "auto"
    job_uid_min: Annotated[
        int,
        Field(
            ge=1000,
            le=2**31 - 2,
            description="First uid (and gid) sluice hands to a tenant's jobs; each tenant gets the next unused "
            "number, never reused. No /etc/passwd entry is made: a bare numeric id with no login shell. Pick a "
            "range no host user, group or container subuid range uses, and another per plane on one host (a "
            "second plane whose range overlaps a live one's is refused at start). Default 200000.",
        ),
    ] = 200_000
    job_uid_max: Annotated[
        int,
        Field(
            ge=1000,
            le=2**31 - 2,
            description="Last uid of the tenant range (inclusive); creating a tenant fails when it is spent. "
            "Default 299999.",
        ),
    ] = 299_999
    job_python: Annotated[
        str | None,
        Field(
            description="Interpreter a job's leading `python`/`python3` runs. Default: the control plane's own. "
            "With isolation on, every tenant uid must be able to execute it and read its libraries and sluice's "
            "SDK, so it must not live under a private home folder (e.g. /root); a launch that cannot is failed "
            "with that reason.",
        ),
    ] = None
    job_max_open_files: Annotated[
        int, Field(ge=64, description="RLIMIT_NOFILE of a job process (open files). Default 65536.")
    ] = 65536
    job_max_processes: Annotated[
        int | None,
        Field(
            ge=16,
            description="RLIMIT_NPROC of a job process: processes and threads its uid may own on the host, over all "
            "of the tenant's jobs (isolation on only). Default 16384; None = unlimited.",
        ),
    ] = 16384
    job_max_file_mb: Annotated[
        int | None,
        Field(ge=1, description="RLIMIT_FSIZE of a job process: largest file it may write, MiB. Default: unlimited."),
    ] = None
    job_core_dumps: Annotated[
        bool, Field(description="Allow a job to write core dumps (RLIMIT_CORE). Default false.")
    ] = False
    warm_memory_mb: Annotated[
        int | None,
        Field(
            ge=64,
            le=16 * 1024 * 1024,
            description="Memory ceiling of a `dataset warm` under isolation, MiB: the helper that fetches as the "
            "tenant's uid runs in a memory cgroup of this size plus the tenant's share of the memory tier (tmpfs: "
            "what it writes there is charged to that cgroup) (it holds up to `workers` items at once, whole, and a "
            "tenant chooses how big they are); past it the warm fails, saying so. Default: a quarter of the node's "
            "RAM. Without a cgroup memory controller the helper runs unbounded (the agent logs why).",
        ),
    ] = None
    resume_max_copy_mb: Annotated[
        int,
        Field(
            ge=1,
            le=1048576,
            description="Most a `--resume-from` submit copies of the old job's checkpoints, MiB (their sizes as the "
            "files say, holes of a sparse file included; holes are not written out). The plane copies as root "
            "inside the request, where the tenant's disk quota does not apply: a larger checkpoint is a 409 naming "
            "its size and this bound. Default 65536 (64 GiB); at most 1048576 (1 TiB).",
        ),
    ] = 65536
    resume_copies_per_tenant: Annotated[
        int,
        Field(
            ge=1,
            le=64,
            description="`--resume-from` checkpoint copies one tenant may have under way at once; one more is a "
            "429 (retry when one has finished). Each may copy resume_max_copy_mb. Default 2.",
        ),
    ] = 2
    resume_copies: Annotated[
        int,
        Field(
            ge=1,
            le=256,
            description="`--resume-from` checkpoint copies under way at once on the whole plane, every tenant's; "
            "one more is a 429. Each holds an API worker thread while it copies. Default 4.",
        ),
    ] = 4

    job_deletes_per_tenant: Annotated[
        int,
        Field(
            ge=1,
            le=64,
            description="`sluice job delete` requests one tenant may have under way at once (each removes its "
            "jobs' run folders before it answers, seconds for a folder of many files); one more is a 429 that "
            "deletes nothing (retry when one has finished). Default 2.",
        ),
    ] = 2
    job_deletes: Annotated[
        int,
        Field(
            ge=1,
            le=256,
            description="`sluice job delete` requests under way at once on the whole plane, every tenant's; one "
            "more is a 429. Each holds an API worker thread while it removes folders. Default 8.",
        ),
    ] = 8

    dataset_source_ops_per_tenant: Annotated[
        int,
        Field(
            ge=1,
            le=64,
            description="Dataset source operations (a `dataset create`'s listing of the source, a `dataset warm`) "
            "one tenant may have under way at once; one more is a 429 (retry when one has finished). Each "
            "holds an API worker thread for as long as the tenant's source takes. Default 2.",
        ),
    ] = 2
    dataset_source_ops: Annotated[
        int,
        Field(
            ge=1,
            le=256,
            description="Dataset source operations under way at once on the whole plane, every tenant's; one more "
            "is a 429. Default 8.",
        ),
    ] = 8
    dataset_list_timeout_s: Annotated[
        float,
        Field(
            gt=0,
            le=3600,
            description="Seconds a `dataset create` may take to list a remote (HTTP, S3) source, its size requests "
            "included; past it the create is a 422 naming `source` (a source with many files should carry a "
            "_sluice_manifest.json). Bounds how long one tenant's source holds its operation slot. Default 120.",
        ),
    ] = 120.0

    net_interface: Annotated[
        str | None,
        Field(
            pattern=r"^[A-Za-z0-9_.-]{1,15}$",
            description="Network interface multi-replica jobs bind their collective traffic to: sets "
            "GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME in every job's environment (a job's own env wins). "
            "`sluice net recommend --apply --interface NAME` writes it. Default: unset (the libraries pick).",
        ),
    ] = None
    checkpoint_roots: Annotated[
        list[str],
        Field(
            description="Folders (or URL prefixes such as s3://bucket/ckpt) where a job's checkpoint.location may "
            "point, besides a path relative to the job's own run folder. Symlinks are resolved before the check. "
            "Env: JSON list, e.g. SLUICE_CHECKPOINT_ROOTS='[\"/mnt/ckpt\"]'. Default: none.",
        ),
    ] = []
    dataset_roots: Annotated[
        list[str],
        Field(
            description="Folders a local dataset source (a path or file:// URL) must lie under, symlinks resolved; "
            "the plane and node agents read them with their own permissions. Env: JSON list. Default: none "
            "(no local sources).",
        ),
    ] = []
    allow_source_hosts: Annotated[
        list[str],
        Field(
            description="Host names and IP networks (CIDR) that http(s)/S3 dataset sources may reach although they "
            'are loopback, link-local or private (e.g. an in-cluster object store: ["10.0.0.0/8:9000"]). An entry '
            "is HOST[:PORT] (IPv6 in brackets: [fd00::/8]:9000); without a port every port of the host is allowed. "
            "Every other non-public address is refused, after DNS resolution and on every redirect. Env: JSON list, "
            "at most 1000 entries. Default: none.",
        ),
    ] = []
    failpoints: Annotated[
        str,
        Field(
            description="Testing only: arm the job book's named failure points, e.g. "
            "`book.transition.after_write=exit@2` (see sluice/control/failpoints.py). Default: none.",
        ),
    ] = ""
    max_body_bytes: Annotated[int, Field(gt=0, description="Largest API request body in bytes. Default 1 MiB.")] = (
        1024 * 1024
    )
    api_header_timeout_s: Annotated[
        float,
        Field(
            ge=1,
            le=300,
            description="Seconds an API connection has to send a request's headers and body (from when it opens, and "
            "after each response), then it is closed: connections that never finish a request held every "
            "descriptor. Default 10.",
        ),
    ] = 10.0
    max_unfinished_jobs_per_tenant: Annotated[
        int,
        Field(
            ge=1,
            le=1_000_000,
            description="Jobs a tenant may have that have not ended (queued, running, suspended); a submit "
            "beyond it is a 409. Every such job is held in the plane's memory and judged every round: "
            "without a bound one tenant's flood slowed every tenant's scheduling. Admins are not capped. "
            "Default 10000.",
        ),
    ] = 10_000
    disk_check_s: Annotated[
        float,
        Field(
            ge=0.1,
            le=3600,
            description="Seconds between measurements of each running job's run folder on its node (its "
            "resources.disk_mb and the node's disk reserve are judged on them). Default 15.",
        ),
    ] = 15.0
    disk_reserve_percent: Annotated[
        float,
        Field(
            ge=0,
            le=50,
            description="Share of the disk holding the runs folder (and, by default, the database) kept free: "
            "while less is free, the job whose run folder holds the most (at least 64 MiB) of those that grew "
            "since the check before is stopped and fails, one each check, so a job writing by mistake does not "
            "fill the disk the plane and every other tenant need (a hostile one can: docs/security.md, Disk); "
            "the same share of its inodes, the job holding the most files (at least 10,000) stopped. "
            "0 turns the reserve off. Default 5.",
        ),
    ] = 5.0
    job_retention_days: Annotated[
        float,
        Field(
            ge=0,
            le=36_500,
            description="Days an ended job is kept after it finished: past them the plane forgets it — its "
            "record, events, log and run folder (with the checkpoints kept there; not those under "
            "checkpoint_roots) — and node events older than that go too. A job another job still waits for "
            "(`after`) and an array with a job that ended later are kept. Usage's held time is not touched "
            "(usage_retention_days). 0 keeps everything for ever. Default 90.",
        ),
    ] = 90.0
    usage_retention_days: Annotated[
        float,
        Field(
            ge=0,
            le=36_500,
            description="Days usage's held time (what each tenant's jobs held and used, by the hour: what "
            "`sluice usage` sums) is kept: whole hours older than that are deleted, so `usage --since` "
            "reaches back at most this far. 0 keeps it for ever. Default 400 (a year and a month).",
        ),
    ] = 400.0
    metrics_token: Annotated[
        str | None,
        Field(
            min_length=16,
            max_length=4096,
            description="Bearer token a Prometheus server sends to read every tenant's series on "
            "/metrics (an admin tenant's token works too; docs/metrics.md). At least 16 characters: it reads "
            "every tenant's job names and usage, and `a` was taken. Default: none.",
        ),
    ] = None
    metrics_recent_finished: Annotated[
        int,
        Field(
            ge=0,
            le=1000,
            description="Finished jobs /metrics keeps reporting (the newest ones) besides every "
            "unfinished job, so a short job is still seen by the next scrape. Default 50.",
        ),
    ] = 50
    pollux_data: Annotated[
        Path | None,
        Field(
            description="Folder holding the Pollux artifact's `workloads*/`, `traces/philly.csv` and "
            "`results-jobload/` (not shipped with sluice: large). `sluice bench sim` and `sluice bench fairness` "
            "read it. Default: `shared/data/pollux` beside the checkout, when there is one.",
        ),
    ] = None
    pollux_traces: Annotated[
        Path | None,
        Field(
            description="Folder of per-application job models (`<app>/placements.csv`, `scalability.csv`, "
            "`validation-*.csv`) the simulator's GPU jobs use instead of the ones shipped in sluice "
            "(sluice/sim/models). Default: the shipped models.",
        ),
    ] = None

    @field_validator("home", mode="after")
    @classmethod
    def _absolute_home(cls, home: Path) -> Path:
        """A relative home (`SLUICE_HOME=h`) named different folders to the plane, its job
        supervisors and its jobs, each resolving it against its own working folder: every job
        failed to launch, and two planes started from different folders read as one store."""
        return home.expanduser().absolute()

    @field_validator("allow_source_hosts", mode="after")
    @classmethod
    def _allow_entries(cls, entries: list[str]) -> list[str]:
        """An entry the guard cannot read (`10.0.0.0/33`, `host:http`) allowed nothing and said
        nothing: the admin's object store stayed refused with no hint why."""
        if len(entries) > MAX_ALLOW_SOURCE_HOSTS:
            raise ValueError(f"at most {MAX_ALLOW_SOURCE_HOSTS} entries")
        for entry in entries:
            parse_allow_entry(entry)
        return entries

    @model_validator(mode="after")
    def _uid_range(self) -> Settings:
        if self.job_uid_max < self.job_uid_min:
            # Named as the user wrote them: a model-level error has no field, and said `SLUICE_?`.
            raise ValueError(
                f"SLUICE_JOB_UID_MAX (`job_uid_max`, {self.job_uid_max}) is below SLUICE_JOB_UID_MIN "
                f"(`job_uid_min`, {self.job_uid_min})"
            )
        return self

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'sluice.db'}"

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"

    @property
    def cache(self) -> CacheSettings:
        """This home's node dataset cache (SLUICE_CACHE_* knobs, folders filled in): what the
        control plane tells jobs and what every node agent opens. The location rule itself is
        `sluice.data.settings.cache_dirs`."""
        return CacheSettings.for_home(self.home)

    @property
    def api_url(self) -> str:
        return f"http://{self.host}:{self.port}"


class SettingsError(ValueError):
    """A setting sluice cannot take, said per setting as the user wrote it: the environment
    variable and the settings.yaml key."""


SECRET_SETTINGS = frozenset({"metrics_token", "database_url"})
"""Settings whose value a refusal does not repeat (a database URL may hold a password)."""


def _settings_error(err: ValidationError, file: Path | None) -> SettingsError:
    where = f" or `{{key}}` in {file}" if file is not None else ""
    lines = []
    for e in err.errors():
        if not e.get("loc"):  # a check of several settings (model_validator): its message names them
            lines.append(str(e["msg"]).removeprefix("Value error, "))
            continue
        key = str(e["loc"][0])
        got = e.get("input")
        shown = f"; got {got!r}" if got is not None and not isinstance(got, dict) else ""
        if key in SECRET_SETTINGS:  # a secret is not echoed to a terminal or a log
            shown = ""
        lines.append(f"SLUICE_{key.upper()}{where.format(key=key)}: {e['msg']}{shown}")
    return SettingsError("; ".join(lines))


def _yaml_problem(err: Exception) -> str:
    """A YAML error in one line: what is wrong and where (line and column, from 1)."""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    mark = getattr(err, "problem_mark", None)
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else str(problem)


def _unknown_key(key: str, file: Path) -> str:
    if key.startswith("cache_"):
        return f"`{key}` in {file}: the cache's settings are read from the environment only (SLUICE_{key.upper()})"
    near = difflib.get_close_matches(key, list(Settings.model_fields), n=1)
    hint = f"; did you mean `{near[0]}`?" if near else " (src/sluice/settings.py lists every one)"
    return f"`{key}` in {file} is not a setting{hint}"


NOT_SETTINGS = frozenset(
    {
        *("token", "url", "debug"),
        *("attempt", "batch_mode", "checkpoint_dir", "checkpoint_interval_s", "checkpoint_keep", "cpu_max"),
        *("global_batch", "gpus", "job_id", "node", "replicas_min", "run_dir", "tenant", "threads"),
        "threads_check_s",
    }
)
"""SLUICE_* variables that are not settings: the CLI's and the client's own, and those a job
gets (sluice.sdk), which a plane started inside a job would see."""


def misspelled_variables(environ: Mapping[str, str]) -> list[str]:
    """`SLUICE_X is not a setting; did you mean SLUICE_Y?` for each SLUICE_* variable that is
    close to a setting's name but is none (pydantic-settings ignores it: `SLUICE_POLCY=kube`
    ran flowcon). Only near misses are named: jobs' and the cache's variables are left alone."""
    out = []
    for var in sorted(environ):
        name = var.removeprefix("SLUICE_").lower()
        if not var.startswith("SLUICE_") or name in Settings.model_fields or name in NOT_SETTINGS:
            continue
        if name.startswith("cache_"):
            continue
        near = difflib.get_close_matches(name, list(Settings.model_fields), n=1, cutoff=0.8)
        if near:
            out.append(f"{var} is not a setting, so it is ignored; did you mean SLUICE_{near[0].upper()}?")
    return out


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment, then `home/settings.yaml`, then explicit overrides.
    SettingsError, naming each bad setting's variable and key, when one cannot be taken."""
    try:
        return _load_settings(overrides)
    except ValidationError as err:
        raise _settings_error(err, _settings_file()) from None
    except PydanticSettingsError as err:
        raise _parse_error(err) from None


def _parse_error(err: PydanticSettingsError) -> SettingsError:
    """A list setting's variable that is not JSON (`SLUICE_CHECKPOINT_ROOTS=/mnt/ckpt`) said
    `error: SettingsError: error parsing value for field "checkpoint_roots" from source ...`."""
    found = re.search(r'field "([a-z_]+)"', str(err))
    if found is None:
        return SettingsError(str(err))
    var = f"SLUICE_{found.group(1).upper()}"
    got = os.environ.get(var, os.environ.get(var.lower()))
    shown = f"; got {got!r}" if got is not None else ""
    return SettingsError(f"{var}: not valid JSON; a list setting takes a JSON list, e.g. '[\"/mnt/ckpt\"]'{shown}")


def _settings_file() -> Path | None:
    try:
        return Settings().home / "settings.yaml"
    except (ValidationError, PydanticSettingsError):
        return None


def _load_settings(overrides: dict[str, object]) -> Settings:
    base = Settings()
    file = base.home / "settings.yaml"
    data: dict[str, object] = {}
    if file.exists():
        import yaml

        from sluice.spec.loading import safe_load_unique

        try:
            # A repeated key (`policy: kube` ... `policy: sluice`) kept the last one silently.
            loaded = safe_load_unique(file.read_text(encoding="utf-8")) or {}
        except UnicodeDecodeError as err:  # said `error: UnicodeDecodeError: ...`, naming no file
            raise SettingsError(f"{file} is not UTF-8 text (byte {err.start})") from None
        except yaml.YAMLError as err:  # said `error: ParserError: ... in "<unicode string>"`
            raise SettingsError(f"{file} is not valid YAML: {_yaml_problem(err)}") from None
        if not isinstance(loaded, dict):
            raise SettingsError(f"{file}: expected a mapping of settings (key: value), got {type(loaded).__name__}")
        if "home" in loaded:  # the file is read from the home: a home it named would be another
            # folder, whose own settings.yaml nobody reads; the state silently moved there
            raise SettingsError(f"`home` in {file}: the home is where this file is read from; set SLUICE_HOME instead")
        unknown = [str(k) for k in loaded if k not in Settings.model_fields]
        if unknown:  # a typo (`polcy: kube`) was silently ignored
            raise SettingsError("; ".join(_unknown_key(k, file) for k in unknown))
        data.update(loaded)
    data.update({k: v for k, v in overrides.items() if v is not None})
    return base.model_copy(update=Settings.model_validate({**base.model_dump(), **data}).model_dump()) if data else base


RAY_ADDRESS_FORMS = "host:port (the GCS, port 1-65535), ray://host:port (Ray Client) or local"


def check_ray_address(address: str) -> tuple[str, str, int | None]:
    """Parse a Ray address: `host:port` of a cluster's GCS, `ray://host:port` (Ray Client) or
    `local` (start a fresh one-node instance). Returns (form, host, port) with form "gcs",
    "client" or "local"; a ValueError says what is wrong in one line.

    `auto` is refused: it makes Ray pick whichever cluster it finds (RAY_ADDRESS, the newest
    `ray start` on this machine), and which one the plane joined must never be a guess."""
    text = address.strip()
    if text == "local":
        return "local", "", None
    if text == "auto":
        raise ValueError(f"'auto' joins whichever Ray cluster Ray finds; name one: {RAY_ADDRESS_FORMS}")
    form = "gcs"
    rest = text
    if "://" in text:
        scheme, _, rest = text.partition("://")
        if scheme != "ray":
            raise ValueError(f"{address!r}: unknown scheme {scheme + '://'!r}; use {RAY_ADDRESS_FORMS}")
        form = "client"
    host, sep, port_text = rest.rpartition(":")
    if form == "client" and not sep:  # ray://host uses Ray Client's default port
        host, port_text = rest, "10001"
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if (not sep and form == "gcs") or not host or any(c.isspace() or c in "/@?#" for c in host):
        raise ValueError(f"{address!r} is not a Ray address; use {RAY_ADDRESS_FORMS}")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"{address!r}: the port must be a number from 1 to 65535")
    return form, host, int(port_text)
