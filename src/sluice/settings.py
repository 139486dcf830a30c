"""Typed settings. Every field: meaning, unit, default. Set through SLUICE_* environment
variables (e.g. SLUICE_POLICY=kube) or a `settings.yaml` in $SLUICE_HOME.

This module imports nothing else of sluice, so every part may read it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_home() -> Path:
    return Path.home() / ".sluice"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SLUICE_", extra="ignore")

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
    engine: Annotated[str, Field(description="Engine: local or ray. Default local.")] = "local"
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
    reconcile_interval_s: Annotated[
        float, Field(gt=0, description="Seconds between reconcile rounds (poll, decide, act). Default 0.5.")
    ] = 0.5
    policy_interval_s: Annotated[
        float,
        Field(gt=0, description="FlowCon's control interval Δ in seconds: how often CPU is re-allocated. Default 10."),
    ] = 10.0
    stop_grace_s: Annotated[
        float, Field(gt=0, description="Seconds between SIGTERM and SIGKILL when stopping a job. Default 20.")
    ] = 20.0
    restart_backoff_s: Annotated[
        float, Field(ge=0, description="Base back-off before a failed job is retried; doubles per restart. Default 2.")
    ] = 2.0
    virtual_nodes: Annotated[
        int, Field(ge=1, le=64, description="Split this machine into N virtual nodes (cpusets). Default 1.")
    ] = 1
    node_cpus: Annotated[
        float | None, Field(gt=0, description="Cores per node offered to jobs. Default: all cores / virtual_nodes.")
    ] = None
    cgroup_root: Annotated[
        str | None, Field(description="Override where job cgroups are made (tests). Default: detected.")
    ] = None
    usage_sample_s: Annotated[
        float, Field(gt=0, description="Seconds between CPU-usage samples of jobs. Default 1.")
    ] = 1.0
    kpi_sample_s: Annotated[float, Field(gt=0, description="Seconds between node KPI samples. Default 1.")] = 1.0
    health_enabled: Annotated[bool, Field(description="Run the node anomaly detector. Default false.")] = False
    health_train_samples: Annotated[
        int, Field(ge=20, description="KPI samples a node must show before its detector is fitted. Default 300.")
    ] = 300
    health_q: Annotated[
        float, Field(gt=0, lt=0.5, description="SPOT risk: chance a healthy score passes the threshold. Default 1e-3.")
    ] = 1e-3
    health_change_grace_s: Annotated[
        float,
        Field(
            ge=0,
            description="Seconds a node's health alarms are held after the control plane changes what runs there "
            "(job placed, stopped, moved, resized; checkpoint). Default 20.",
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
        int, Field(ge=20, description="Healthy KPI samples kept per node for refits. Default 1800 (30 min).")
    ] = 1800
    max_body_bytes: Annotated[int, Field(gt=0, description="Largest API request body in bytes. Default 1 MiB.")] = (
        1024 * 1024
    )

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'sluice.db'}"

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"

    @property
    def api_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment, then `home/settings.yaml`, then explicit overrides."""
    base = Settings()
    file = base.home / "settings.yaml"
    data: dict[str, object] = {}
    if file.exists():
        import yaml

        loaded = yaml.safe_load(file.read_text()) or {}
        if isinstance(loaded, dict):
            data.update(loaded)
    data.update({k: v for k, v in overrides.items() if v is not None})
    return base.model_copy(update=Settings.model_validate({**base.model_dump(), **data}).model_dump()) if data else base
