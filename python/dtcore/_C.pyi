# Type stub for dtcore._C, the C++ core (csrc/bindings/, one file per area).
# tests/py/test_layout.py keeps it in step with the module: every name and member, no more.
from collections.abc import Callable
from typing import Any

import torch

Argument = bool | int | float | str  # one init() argument; None means "not given"

# common (csrc/bindings/common.cpp) --------------------------------------------------------------

__version__: str
built_torch_version: str

class DtcoreError(RuntimeError): ...
class ConfigError(DtcoreError): ...
class RendezvousError(DtcoreError): ...
class CommError(DtcoreError): ...
class CheckpointError(DtcoreError): ...

def knobs() -> list[tuple[str, str, str]]: ...
def unknown_knobs(env: dict[str, str] | None = None) -> list[str]: ...
def parse_bytes(text: str, what: str = ...) -> int: ...
def format_bytes(bytes: int) -> str: ...

class Settings:
    """How dtcore behaves here, each value from init() > DTCORE_* > default (csrc/dtcore/common/settings.h)."""

    timeout_s: float
    backend: str
    log_level: str
    log_ranks: str
    log_dir: str
    rdzv_log_interval_s: float
    heartbeat_interval_s: float
    check_collectives: str
    flight_records: int
    shared_memory: str
    memory_dir: str
    sources: dict[str, str]
    def console_level(self, rank: int) -> str: ...

def read_settings(arguments: dict[str, Argument | None] = ..., env: dict[str, str] | None = None) -> Settings: ...
def configure_logging(rank: int, world_size: int, host: str, settings: Settings) -> str: ...
def log(level: int, message: str) -> None: ...
def log_enabled(level: int) -> bool: ...
def flush_logs() -> None: ...

# bootstrap (csrc/bindings/bootstrap.cpp) --------------------------------------------------------

class WorldSpec:
    """The job as one process sees it; see Note [World fields] in csrc/dtcore/bootstrap/world_spec.h."""

    FIELDS: tuple[str, ...]
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    sources: dict[str, str]
    launcher: str
    use_agent_store: bool
    restart_count: int
    cuda_visible_devices: str
    job_id: str
    job_id_source: str
    def __init__(self, other: WorldSpec) -> None: ...
    def describe(self) -> str: ...

def read_world(env: dict[str, str] | None = None, overrides: dict[str, Argument | None] = ...) -> WorldSpec: ...
def validate_overrides(overrides: dict[str, Argument | None]) -> None: ...

class Problem:
    field: str
    variable: str
    value: str
    message: str
    fix: str
    def label(self) -> str: ...

def check_world(
    spec: WorldSpec, backend: str, visible_gpus: int = -1, host: str = "", resolve_master: bool = True
) -> list[Problem]: ...
def validate_world(
    spec: WorldSpec, backend: str, visible_gpus: int = -1, host: str = "", resolve_master: bool = True
) -> None: ...
def cuda_device_index(spec: WorldSpec, visible_gpus: int) -> int: ...
def choose_backend(settings: Settings, cuda_devices: int, torch_version: str, spec: WorldSpec) -> str: ...
def accelerate_started_fewer(spec: WorldSpec, config_path: str = "", config_text: str = "") -> str: ...

class RosterEntry:
    rank: int
    host: str
    pid: int
    local_rank: int
    device: str
    device_id: str
    fingerprint: dict[str, str]

class Rendezvous:
    store: Any  # torch.distributed.Store
    port: int
    spec: WorldSpec
    def roster(self) -> list[RosterEntry]: ...
    def close(self) -> None: ...

def rendezvous(
    spec: WorldSpec,
    settings: Settings,
    host: str,
    device: str,
    fingerprint: dict[str, str],
    generation: int = 0,
    device_id: str = "",
    store: Any | None = None,  # torch.distributed.Store: rendezvous on it instead of serving one
) -> Rendezvous: ...

# comm (csrc/bindings/comm.cpp) ------------------------------------------------------------------

has_nccl: bool

def nccl_version() -> str: ...
def wait_seconds() -> float: ...

class Work:
    def wait(self, timeout_s: float | None = None) -> None: ...
    def wait_on_stream(self) -> None: ...
    def is_completed(self) -> bool: ...

class Communicator:
    backend: str
    rank: int
    size: int
    ranks: list[int]  # the members' job ranks, by rank in this communicator
    timeout_s: float
    engine: Any  # the torch.distributed.ProcessGroupGloo a Gloo communicator drives; None with NCCL or once closed
    shared_memory: bool  # a Gloo communicator's ranks exchange through shared memory (DTCORE_SHM)
    def shared_buffer(self, nbytes: int) -> torch.Tensor | None: ...  # a collective; See shm_buffers.h
    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> Work: ...
    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str = "sum") -> Work: ...
    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> Work: ...
    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> Work: ...
    def barrier(self) -> Work: ...
    def set_health(self, health: HealthMonitor) -> None: ...
    def set_flight_dump(self, path: str, host: str) -> None: ...
    def dump_flight_record(self, why: str) -> str: ...
    def close(self) -> None: ...

class HealthMonitor:
    interval_s: float
    def close(self) -> None: ...
    def diagnose(self, failing_seq: int, op_name: str = "collective") -> str: ...

def health_monitor(
    rendezvous: Rendezvous, settings: Settings, ranks: list[int] = ..., prefix: str = ...
) -> HealthMonitor: ...
def gloo_communicator(backend: Any, settings: Settings, ranks: list[int] = ...) -> Communicator: ...
def nccl_communicator(store: Any, rank: int, size: int, device: int, settings: Settings) -> Communicator:
    """Only when has_nccl."""
    ...

# reducer (csrc/bindings/reducer.cpp) ------------------------------------------------------------

class ReducerOptions:
    """The reducer's options and their defaults (csrc/dtcore/reducer/reducer.h); bucket sizes in MiB."""

    bucket_mb: float
    first_bucket_mb: float
    find_unused_parameters: bool
    comm_dtype: torch.dtype | None
    zero: int
    static_graph: bool
    skip_all_reduce_unused_params: bool
    auto_buckets: bool
    def __init__(
        self,
        bucket_mb: float = ...,
        first_bucket_mb: float = ...,
        find_unused_parameters: bool = ...,
        comm_dtype: torch.dtype | None = None,
        zero: int = ...,
        static_graph: bool = ...,
        skip_all_reduce_unused_params: bool = ...,
        auto_buckets: bool = ...,
    ) -> None: ...
    def check(self) -> None:
        """ConfigError naming the first option a reducer cannot honour, with the fix."""
        ...

class ShardPiece:
    """A parameter's part in this rank's shard (Note [Shard layout])."""

    param: int
    param_offset: int
    shard_offset: int
    numel: int

class BucketShard:
    """This rank's shard of one bucket: padded size, shard size, first element, pieces."""

    padded_numel: int
    shard_numel: int
    begin: int
    pieces: list[ShardPiece]

class Reducer:
    """Averages gradients across ranks during backward (dtcore.wrap builds one)."""

    find_unused_parameters: bool  # settable between backward passes
    reductions: int
    zero: int
    plan_final: bool
    plan_version: int
    static_graph: bool
    static_graph_recorded: bool  # the parameters a static graph uses are known: no search, no output function
    last_buckets_reduced: int  # buckets reduced in the last reduced backward (torch's num_buckets_reduced)
    order_rebuilt: bool  # buckets rebuilt in the order gradients became ready (torch's has_rebuilt_buckets)
    backward_errors: int  # errors raised inside backward so far (last_backward_error() gives the last one)
    def set_static_graph(self) -> None:
        """torch DDP's _set_static_graph(), before the first reduced backward."""
        ...
    def last_backward_error(self) -> tuple[int, str, str]:
        """(errors raised inside backward so far, the last one's class name, its message)."""
        ...
    def __init__(
        self, params: list[torch.Tensor], names: list[str], communicator: Communicator, options: ReducerOptions = ...
    ) -> None: ...
    def shards(self) -> list[BucketShard]: ...
    def grad_shards(self) -> list[torch.Tensor]:
        """This rank's reduced gradient shard of every bucket (zero >= 1)."""
        ...
    def zero_grad(self, set_to_none: bool = True) -> None: ...
    def params_without_grad(self) -> list[int]: ...
    def bucket_layout(self) -> list[list[tuple[int, int, int]]]:
        """Per bucket: (index, offset, numel) of each parameter, in layout order."""
        ...
    def prepare_for_backward(self, sync: bool = True) -> None: ...
    def find_unused(self, outputs: list[torch.Tensor]) -> None: ...
    def bucket_params(self) -> list[list[int]]:
        """Per bucket, the indices (among parameters that require grad) in layout order."""
        ...
    def register_comm_hook(self, state: object, hook: Callable[[object, Any], torch.futures.Future]) -> None:
        """hook(state, bucket: torch.distributed.GradBucket) reduces each bucket instead of the reducer."""
        ...
    def install_post_backward_futures(self, futures: list[torch.futures.Future]) -> None:
        """Futures the coming backward waits for (with the timeout) before it ends."""
        ...
    def set_divisor(self, ranks: int) -> None:
        """The coming backward averages over `ranks` ranks instead of the world size."""
        ...
    def check_joinable(self) -> None: ...
    def last_backward_times(self) -> tuple[int, int, int]:
        """(comm start, compute end, comm end) of the last reduced backward, ns since the epoch; 0 if not reached."""
        ...
    def last_ready_order(self) -> list[int]:
        """The parameters' indices in the order they were ready in the last reduced backward."""
        ...
    def auto_plan_info(self) -> dict[str, float | bool]:
        """bucket_mb="auto": what the final plan was chosen from (chosen, alpha_us, us_per_mib, backward_ms) and
        the communication it expects after the backward (exposed_ms; default_exposed_ms for the default caps)."""
        ...
    def adopt_plan(self, buckets: list[list[int]]) -> None:
        """Builds these buckets (bucket_params()'s form) as the final plan, before the first reduction."""
        ...
    def release_parameters(self) -> None:
        """Removes this reducer's hooks: a newer wrapper of the same parameters takes them over."""
        ...
    def shadow_backward(self) -> None:
        """A joined rank's side of the others' synced backward: each bucket's collective on zeros."""
        ...

# check (csrc/bindings/check.cpp) ----------------------------------------------------------------

class VersionFacts:
    python: str
    torch: str
    torch_cuda: str
    torch_cxx11_abi: bool
    torch_nccl: str
    dtcore: str
    built_torch: str
    built_cxx11_abi: bool
    built_cuda: str
    built_with_nccl: bool
    dtcore_nccl: str
    rebuild_command: str
    def __init__(self) -> None: ...

class CheckInputs:
    env: dict[str, str]
    world_arguments: dict[str, Argument | None]
    settings_arguments: dict[str, Argument | None]
    versions: VersionFacts
    nccl_dirs: list[str]
    arch_list: list[str]
    host: str
    shm_path: str
    checkpoint_dir: str | None
    min_free_disk_gb: float
    accelerate_config_path: str
    accelerate_config_text: str
    wandb_installed: bool
    wandb_credentials: bool
    distributed: bool
    preflight: bool
    job_pids: list[int]
    pid_namespace: bool
    def __init__(self) -> None: ...

class CheckItem:
    id: str
    group: str
    title: str
    status: str
    value: str
    message: str
    fix: str

class GpuDevice:
    index: int
    name: str
    uuid: str
    memory_total: int
    memory_free: int
    cc_major: int
    cc_minor: int
    mig_enabled: bool

class GpuFacts:
    driver_loaded: bool
    driver_version: str
    cuda_driver_version: int
    devices: list[GpuDevice]

class CheckResult:
    items: list[CheckItem]
    spec: WorldSpec | None
    settings: Settings
    backend: str
    visible_gpus: int
    gpus: GpuFacts

def run_checks(inputs: CheckInputs) -> CheckResult: ...

# activation (csrc/bindings/activation.cpp) ------------------------------------------------------

class CheckpointMode:
    keep: CheckpointMode
    full: CheckpointMode
    selective: CheckpointMode
    name: str
    value: int

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

# --- checkpoint (csrc/dtcore/checkpoint) ----------------------------------------------------

class FileDigest:
    bytes: int
    sha256: str  # lower-case hex

def write_safetensors(path: str, tensors: list[tuple[str, torch.Tensor]], metadata: dict[str, str]) -> FileDigest:
    """(name, contiguous CPU tensor) pairs as one safetensors file, atomically; the GIL is released."""

def write_file_atomic(path: str, data: str) -> FileDigest: ...
def digest_file(path: str) -> FileDigest: ...
def encode_json(
    value: object,
    tensors: list[tuple[str, torch.Tensor]] | None,
    where: str,
    other: Callable[[object, list[tuple[str, torch.Tensor]] | None, str], str],
    tags: frozenset[str],
    exact: bool = False,
) -> str:
    """checkpoint/values.py's encoding of `value` as JSON text (see values.encode_json)."""

class TensorWatch:
    """Whether tensors are where a layout found them (memory.py's _Watch): every table of its size, every (owner,
    name) entry its very object (a tensor at its address), every empty name without a value."""

    def __init__(
        self,
        tables: list[dict[str, Any]],
        owners: list[dict[str, Any]],
        names: list[str],
        tensors: list[object],
        empty_owners: list[dict[str, Any]],
        empty_names: list[str],
    ) -> None: ...
    def same(self) -> bool: ...

class CopyPlan:
    """An in-memory checkpoint's byte copies (csrc/dtcore/checkpoint/copy_plan.h): destination i receives
    source i; the destinations after the sources receive run()'s `tail`, in order."""

    tail_size: int
    bytes: int
    def __init__(self, destinations: list[torch.Tensor], sources: list[torch.Tensor]) -> None: ...
    def run(self, tail: list[torch.Tensor]) -> None: ...
