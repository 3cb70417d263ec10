# Type stub for dtcore._C (csrc/bindings/module.cpp).
from typing import Optional

import torch

__version__: str
built_torch_version: str
has_nccl: bool

class DtcoreError(RuntimeError): ...
class ConfigError(DtcoreError): ...
class RendezvousError(DtcoreError): ...
class CommError(DtcoreError): ...
class CheckpointError(DtcoreError): ...

def nccl_version() -> str: ...
def knobs() -> list[tuple[str, str, str]]: ...
def knob_value(name: str, env: Optional[dict[str, str]] = None) -> Optional[str]: ...
def knob_seconds(name: str, env: Optional[dict[str, str]] = None) -> Optional[float]: ...
def configure_logging(
    rank: int, world_size: int, host: str, console_level: str, log_dir: str, level_source: str = "console level"
) -> str: ...
def log(level: int, message: str) -> None: ...
def log_enabled(level: int) -> bool: ...
def flush_logs() -> None: ...

class WorldSpec:
    launcher: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    use_agent_store: bool
    restart_count: int
    sources: dict[str, str]
    def describe(self) -> str: ...

def read_world(env: Optional[dict[str, str]] = None, overrides: dict = ...) -> WorldSpec: ...

class Problem:
    variable: str
    value: str
    message: str
    fix: str

def check_world(
    spec: WorldSpec, backend: str, visible_gpus: int = -1, host: str = "", resolve_master: bool = True
) -> list[Problem]: ...
def validate_world(
    spec: WorldSpec, backend: str, visible_gpus: int = -1, host: str = "", resolve_master: bool = True
) -> None: ...

class Rendezvous:
    store: object  # torch.distributed.Store
    port: int
    uses_libuv: bool
    def roster(self) -> list[dict]: ...
    def close(self) -> None: ...

def rendezvous(
    spec: WorldSpec,
    host: str,
    device: str,
    fingerprint: dict[str, str],
    timeout_s: float,
    log_interval_s: float = 5.0,
    libuv: str = "auto",
    generation: int = 0,
) -> Rendezvous: ...
def cuda_device_index(spec: WorldSpec, visible_gpus: int) -> int: ...

class Work:
    def wait(self, timeout_s: float) -> None: ...
    def is_completed(self) -> bool: ...

class Communicator:
    backend: str
    rank: int
    size: int
    timeout_s: float
    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> Work: ...
    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str = "sum") -> Work: ...
    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> Work: ...
    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> Work: ...
    def barrier(self) -> Work: ...
    def set_health(self, health: HealthMonitor) -> None: ...
    def close(self) -> None: ...

class HealthMonitor:
    interval_s: float
    def close(self) -> None: ...
    def diagnose(self, failing_seq: int, op_name: str = "collective") -> str: ...

def health_monitor(rendezvous: Rendezvous, interval_s: float) -> HealthMonitor: ...

class Reducer:
    """Internal until dtcore.wrap is complete: averages gradients across ranks during backward."""

    reductions: int
    def __init__(
        self,
        params: list[torch.Tensor],
        names: list[str],
        communicator: Communicator,
        bucket_mb: float = 25.0,
        first_bucket_mb: float = 1.0,
        find_unused_parameters: bool = False,
        comm_dtype: Optional[torch.dtype] = None,
    ) -> None: ...
    def prepare_for_backward(self, sync: bool = True) -> None: ...
    def find_unused(self, outputs: list[torch.Tensor]) -> None: ...
    def bucket_params(self) -> list[list[int]]:
        """Per bucket, the indices (among parameters that require grad) in layout order."""
        ...

def gloo_communicator(backend: object, timeout_s: float) -> Communicator: ...
def nccl_communicator(store: object, rank: int, size: int, device: int, timeout_s: float) -> Communicator: ...

# Resource checker (csrc/dtcore/check/): items as dicts with id, group, title, status, value, message, fix.
def run_checks(
    env: dict[str, str],
    facts: dict,
    nccl_dirs: list[str],
    arch_list: list[str],
    host: str,
    shm_path: str,
    dirs: list[tuple[str, str]],
    min_free_disk_gb: float,
    accelerate_config_path: str,
    accelerate_config_text: str,
    wandb_installed: bool,
    wandb_credentials: bool,
    distributed: bool,
    preflight: bool,
    job_pids: list[int],
    pid_namespace: bool,
) -> dict: ...

class CheckpointMode:
    keep: CheckpointMode
    full: CheckpointMode
    selective: CheckpointMode
    name: str

class BlockProfile:
    """One block for the checkpoint planner (Note [Checkpoint peak model])."""

    name: str
    activation_bytes: int
    input_bytes: int
    forward_seconds: float
    selective_bytes: int
    selective_seconds: float
    selective_shared_bytes: int
    def __init__(
        self,
        name: str,
        activation_bytes: int,
        input_bytes: int,
        forward_seconds: float,
        selective_bytes: int = -1,
        selective_seconds: float = 0.0,
        selective_shared_bytes: int = -1,
    ) -> None: ...

class CheckpointPlan:
    feasible: bool
    modes: list[CheckpointMode]
    peak_bytes: int
    recompute_seconds: float
    min_peak_bytes: int
    baseline_peak_bytes: int

def plan_checkpoints(blocks: list[BlockProfile], fixed_bytes: int, budget_bytes: int) -> CheckpointPlan: ...
def predicted_peak(blocks: list[BlockProfile], fixed_bytes: int, modes: list[CheckpointMode]) -> int: ...
def recompute_seconds(blocks: list[BlockProfile], modes: list[CheckpointMode]) -> float: ...
