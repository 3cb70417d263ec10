"""DistributedModel (dtcore.wrap with zero=0|1|2): gradients averaged during backward.

On construction: every rank must hold the same parameters (names, shapes, dtypes; a mismatch is a
ConfigError naming the ranks and the first differing parameter), then parameters and buffers are
broadcast from rank 0 and the C++ reducer takes over the gradients (csrc/dtcore/reducer). The
reducer's options and their defaults are its own (_C.ReducerOptions); the signature here reads
them from there.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from .. import _C
from ..bootstrap.context import get_context, is_initialized
from ..comm import agree
from ..comm.collectives import broadcast_tensors
from ..comm.subgroup import communicator_for
from . import stacking, zero_guard
from .comm_hooks import CommHooks
from .compiled import SplittingGraphs
from .logging_data import DdpLogging, records_errors
from .outputs import join_outputs, tensors_in
from .torch_face import TorchDDPFace
from .uneven import Uneven

_DEFAULTS = _C.ReducerOptions()
# dtcore.wrap's bucket size: measured (Note [Buckets that size themselves]), unless the process asked
# torch for deterministic algorithms, which fixes the default caps (bucket_options says why). torch's
# face (dtcore.DistributedDataParallel) keeps torch's bucket_cap_mb=25, the reducer's own default.
DEFAULT_BUCKET_MB: float | str = "auto"
_log = logging.getLogger("dtcore.reducer")


def _signature(named: list[tuple[str, torch.Tensor]]) -> list[str]:
    # requires_grad too: ranks that freeze differently would plan different buckets
    return [f"{name} {tuple(p.shape)} {p.dtype}{'' if p.requires_grad else ' frozen'}" for name, p in named]


class DistributedModel(CommHooks, Uneven, DdpLogging, TorchDDPFace):
    """Wraps `module`; `forward` passes through, `.module` is the original. See dtcore.wrap.

    bucket_mb: "auto" (the default) cuts the buckets where they hide the most communication, from the
    first backward's timeline and the measured cost of an all-reduce (Note [Buckets that size
    themselves]; before that backward, buckets of the default caps); a checkpoint keeps the plan, so
    that a resumed job does not measure again. Under torch.use_deterministic_algorithms(True) "auto"
    takes the default caps (bucket_options says why). A number: bucket caps in MiB (2^20 bytes, as
    torch DDP's bucket_cap_mb), the first bucket first_bucket_mb, small so that communication starts
    early in backward. comm_dtype: send
    gradients as torch.bfloat16 or torch.float16. find_unused_parameters: allow parameters that get
    no gradient in some steps. broadcast_buffers: broadcast rank 0's buffers before each forward.
    zero: 0 keeps whole gradients on every rank; 1 shards the optimizer state and 2 the gradients
    too (after backward every .grad is None): step with dtcore.ShardedOptimizer (ZeRO-1/2).

    It is a torch.nn.parallel.DistributedDataParallel to `isinstance`, so that tools unwrap it
    (torch_face.py). copy.deepcopy and torch.save/torch.load give a working copy with a reducer of
    its own on the current dtcore context.

    torch DDP's communication hooks (register_comm_hook, comm_hooks.py), uneven inputs (join(),
    uneven.py) and logging data (_get_ddp_logging_data, logging_data.py) work as there.

    Wrapping the same parameters again (as torch's tests do in a loop) makes the new wrapper take them
    over: this one then refuses forward and backward with a ConfigError that says it was replaced.
    """

    _retired: tuple[str, str] | None = None  # (what happened, the fix) once its hooks are gone: _retire
    _plan_adopted = False  # bucket_mb="auto": the plan came from a checkpoint (adopt_bucket_plan)
    _ddp_sink_clone = True  # torch DDP's: the output function clones the outputs (_set_ddp_sink_clone)

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        bucket_mb: float | str = DEFAULT_BUCKET_MB,
        first_bucket_mb: float = _DEFAULTS.first_bucket_mb,
        comm_dtype: torch.dtype | None = _DEFAULTS.comm_dtype,
        find_unused_parameters: bool = _DEFAULTS.find_unused_parameters,
        broadcast_buffers: bool = True,
        zero: int = _DEFAULTS.zero,
    ) -> None:
        if zero == 3:
            raise _C.ConfigError(
                f"{type(self).__name__}(zero=3): fully sharded models are built by dtcore.wrap(model, zero=3). Fix: "
                "call dtcore.wrap with zero=3 (its units=, prefetch=, param_dtype= are zero=3's own)."
            )
        options = dict(
            **bucket_options(bucket_mb),
            first_bucket_mb=first_bucket_mb,
            find_unused_parameters=find_unused_parameters,
            comm_dtype=comm_dtype,
            zero=zero,
        )
        stacking.check_wrappable(module)  # before any collective: every rank refuses alike
        self._build(module, options, forward_sync_buffers=broadcast_buffers, init_sync_buffers=True)

    def _build(
        self,
        module: torch.nn.Module,
        options: dict[str, Any],
        *,
        forward_sync_buffers: bool,
        init_sync_buffers: bool,
        process_group: Any = None,
    ) -> None:
        """The construction both faces share (DistributedDataParallel maps torch's arguments onto it).

        `process_group`: torch's group to reduce over, the whole job when None; a proper subgroup gets a
        communicator of its own (See Note [Subgroup communicators] in csrc/dtcore/comm/communicator.h),
        over which parameters are compared, broadcast from the group's first rank, and averaged."""
        torch.nn.Module.__init__(self)  # not torch DDP's __init__: its reducer would stack on dtcore's
        # The caller checked the module with stacking.check_wrappable, before any collective.
        # The communicator this model reduces over (the job's, or its group's).
        self._comm = communicator_for(process_group, f"{type(self).__name__}(process_group=...)")
        if self._comm is not get_context().communicator and options["zero"]:
            raise _C.ConfigError(  # ZeRO's optimizer steps and gathers over the job's communicator
                f"{type(self).__name__}(zero={options['zero']}) over a group of ranks {self._comm.ranks}: ZeRO shards "
                "over the whole job only (ShardedOptimizer gathers parameters from every rank). Fix: zero=0 with a "
                "subgroup, or ZeRO over the whole job."
            )
        self.module = module
        # torch DDP's: names (of parameters and buffers) that the module asked not to be reduced nor
        # broadcast (DistributedDataParallel._set_params_and_buffers_to_ignore_for_model).
        self.parameters_to_ignore = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))
        agree.check_same(
            _signature(self._named_parameters()),
            what="the model (parameter names, shapes, dtypes and requires_grad)",
            item="parameter",
            fix="build the same model on every rank (same code, same configuration) before wrapping it.",
            communicator=self._comm,
        )
        fixed = options.pop("auto_fixed", False)  # bucket_mb="auto" under deterministic algorithms
        agree.check_same(  # the reducer's collectives depend on them: Note [Buckets that size themselves]
            [
                "bucket_mb=auto, fixed by torch.use_deterministic_algorithms(True)"
                if fixed
                else f"bucket_mb={'auto' if options.get('auto_buckets') else options['bucket_mb']}"
            ],
            what="the bucket size (bucket_mb)",
            item="value",
            fix="pass the same bucket_mb to dtcore.wrap on every rank, and call torch.use_deterministic_algorithms "
            "alike on every rank before it (deterministic algorithms fix bucket_mb='auto' at the default caps).",
            communicator=self._comm,
        )
        self._broadcast_initial(init_sync_buffers)
        # Plain values, so that a copy or an unpickled model builds its own reducer from them.
        self._options = options
        # torch DDP's attributes of the same names and meaning, which tools read or set (accelerate's
        # trigger_sync_in_backward sets both flags). See Note [torch DDP's members].
        self.require_backward_grad_sync = True  # False inside no_sync()
        self.require_forward_param_sync = True  # whether the last forward was a synced one
        self.forward_sync_buffers = forward_sync_buffers  # also as torch DDP's broadcast_buffers property
        self.find_unused_parameters = options["find_unused_parameters"]
        self.gradient_as_bucket_view = True
        self.static_graph = False
        self.process_group = process_group if process_group is not None else _default_group()
        self.dim = 0
        ctx = get_context()
        self.device = ctx.device
        self.device_type = ctx.device.type
        self.device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        self.output_device = self.device_ids[0] if self.device_ids else None
        self.is_multi_device_module = False
        self.logger = None  # torch's DDP logger (its Optional): dtcore logs through its own
        self.bucket_bytes_cap = int(options["bucket_mb"] * 2**20)
        self.bucket_bytes_cap_list: list[int] = []  # torch's: per-bucket caps, when bucket_cap_mb_list was given
        self.broadcast_bucket_size = 250 * 2**20  # torch's, for callers of torch.distributed.utils._sync_module_states
        self._attach()
        self._start_logging()

    def _broadcast_initial(self, init_sync_buffers: bool) -> None:
        """Parameters (and buffers) from the group's first rank, as torch DDP, before the reducer exists."""
        if self._comm.size > 1:
            buffers = self._named_buffers() if init_sync_buffers else []
            tensors = [p.detach() for _, p in self._named_parameters()] + [b for _, b in buffers]
            broadcast_tensors(tensors, 0, self._comm)

    def _named_parameters(self) -> list[tuple[str, torch.Tensor]]:
        """The parameters this model reduces: the module's (tied ones once), less the ignored ones."""
        return [(n, p) for n, p in self.module.named_parameters() if n not in self.parameters_to_ignore]

    def _named_buffers(self) -> list[tuple[str, torch.Tensor]]:
        return [(n, b) for n, b in self.module.named_buffers() if n not in self.parameters_to_ignore]

    @property
    def _synced_buffers(self) -> list[torch.Tensor]:
        """The buffers a synced forward broadcasts, collected anew each time: a buffer reassigned in place
        of the attribute (module.buf = module.buf + 1) is a new tensor; ignored ones are left out. Their
        `.data`, so that the broadcast does not count as an in-place change to autograd, as torch DDP's does
        not: a backward still pending (BatchNorm saves its running statistics) is not refused for it."""
        return [b.data for _, b in self._named_buffers()] if self._comm.size > 1 else []

    def _attach(self) -> None:
        """Builds this model's reducer on the current context (at wrap, or in a copy at first use)."""
        named = self._named_parameters()
        options = _C.ReducerOptions(**self._options)
        options.check()  # before an earlier wrapper of these parameters gives anything up
        stacking.take_over(self, [p for _, p in named])
        self._live_reducer = _C.Reducer([p for _, p in named], [n for n, _ in named], self._comm, options)
        self._trainable = [p for _, p in named if p.requires_grad]  # the reducer's indices (bucket_layout)
        self._trainable_names = [n for n, p in named if p.requires_grad]
        stacking.claim(self, [p for _, p in named])
        self._reattach_hooks(self._live_reducer)
        if self._options["zero"] == 2:
            zero_guard.guard(self.module)

    def _retire(self, what: str, fix: str) -> None:
        """This model's hooks go (a newer wrapper takes its parameters over, stacking.take_over, or
        _remove_autograd_hooks()); every later use of its reducer raises ConfigError saying `what`."""
        if self._retired is not None:
            return
        if self._live_reducer is not None:
            self._live_reducer.release_parameters()
        self._live_reducer = self._trainable = self._trainable_names = None  # its buckets go with it
        self._retired = (what, fix)

    def _remove_autograd_hooks(self) -> None:
        """As torch DDP's: the reducer's hooks leave the parameters; this model then refuses forward and backward."""
        self._retire(
            "had its gradient hooks removed (_remove_autograd_hooks())",
            "wrap the module again (dtcore.wrap or DistributedDataParallel) to train it data-parallel.",
        )

    @property
    def _reducer(self) -> Any:
        if self._retired is not None:
            what, fix = self._retired
            raise _C.ConfigError(
                f"this {type(self).__name__} of {type(self.module).__name__} {what}: it no longer averages "
                f"gradients, so it refuses forward and backward. Fix: {fix}"
            )
        if self._live_reducer is None:  # an unpickled copy: its reducer is built on first use
            if not is_initialized():
                raise _C.ConfigError(
                    f"this {type(self).__name__} of {type(self.module).__name__} was unpickled in a process "
                    "without a dtcore context, so it has no reducer to average its gradients. Fix: call "
                    "dtcore.init() before using it (it then reduces over that job), or use its .module alone."
                )
            self._comm = get_context().communicator
            self._attach()
        return self._live_reducer

    def __getstate__(self) -> dict[str, Any]:
        """As torch DDP's: the reducer stays behind; a copy or an unpickled model builds its own."""
        state = self.__dict__.copy()
        for name in (
            "_live_reducer",
            "_trainable",
            "_trainable_names",
            "process_group",
            "_comm",
        ):  # no pickling a group
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        torch.nn.Module.__setstate__(self, state)
        self.process_group = _default_group()  # as torch DDP's: the copy reduces over the whole job
        self._live_reducer = None
        if is_initialized():
            self._comm = get_context().communicator
            self._attach()

    @torch._disable_dynamo(recursive=False)  # See Note [dtcore under torch.compile]
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        synced, sync_buffers, src = self._forward_prologue()
        try:
            with SplittingGraphs(self):
                out = self.module(*args, **kwargs)
        except _C.DtcoreError as e:  # recorded as records_errors records the prologue's and epilogue's
            self._record_error(type(e).__name__, str(e))
            raise
        return self._forward_epilogue(out, synced, sync_buffers, src)

    @torch._disable_dynamo
    @records_errors
    def _forward_prologue(self) -> tuple[bool, bool, int]:
        """Before the module runs: arms the reducer, broadcasts buffers. Returns (synced, sync_buffers, the
        rank buffers come from)."""
        stacking.refuse_outer_ddp(self)
        # Only a forward with grad enabled prepares a reduction, and only a synced one talks to the
        # other ranks: a rank evaluating alone under torch.no_grad() issues no collective.
        sync = self.require_backward_grad_sync
        synced = torch.is_grad_enabled() and sync
        self.require_forward_param_sync = synced
        reducer = self._reducer
        if synced:  # torch DDP's iteration
            self._log_forward_start()
        if torch.is_grad_enabled():
            reducer.prepare_for_backward(sync)
        src = self._join_before_forward(synced)  # with join(): Note [Shadowed collectives]
        sync_buffers = synced and self.forward_sync_buffers  # e.g. BatchNorm running statistics, as DDP does
        if sync_buffers:
            self._sync_forward_buffers(src, post_forward=False)
        return synced, sync_buffers, src

    @torch._disable_dynamo
    @records_errors
    def _forward_epilogue(self, out: Any, synced: bool, sync_buffers: bool, src: int) -> Any:
        if sync_buffers:
            self._sync_forward_buffers(src, post_forward=True)
        if synced:
            self._log_forward_end()
        if synced and (self.find_unused_parameters or self.static_graph):
            reducer = self._reducer
            recorded = reducer.static_graph_recorded  # its unused parameters are known: no join, no search
            if not recorded:  # See Note [Outputs the loss does not use] (outputs.py)
                out = join_outputs(out, clone=self._ddp_sink_clone)
            reducer.find_unused([] if recorded else tensors_in(out))
        return out

    def _arm_sync_backward(self, outputs: Any) -> None:
        """torch DDP's reducer.prepare_for_backward(outputs): the next backward reduces, whatever the
        forward before it was (accelerate's trigger_sync_in_backward, after forwards under no_sync)."""
        self._reducer.prepare_for_backward(True)
        tensors = tensors_in(outputs)
        if (self.find_unused_parameters or self.static_graph) and tensors:
            self._reducer.find_unused(tensors)

    def _set_ddp_sink_clone(self, val: bool) -> None:
        """As torch DDP's: whether the function the outputs pass through with find_unused_parameters (or in a
        static graph's first step) clones them, so that they may be changed in place (True, the default)."""
        if not isinstance(val, bool):
            raise _C.ConfigError(f"_set_ddp_sink_clone({val!r}): expected True or False. Fix: pass a bool.")
        self._ddp_sink_clone = val

    @records_errors  # as torch records it
    def _set_static_graph(self) -> None:
        """As torch DDP's static_graph=True: the set of parameters used in each step does not change, so
        unused ones need not be declared (find_unused_parameters): the first backward finds them, later ones
        need no search, and a graph that changes is an error naming the parameter (See Note [Static graph])."""
        if self.static_graph:
            warnings.warn("You've set static_graph to be True, no need to set it again.", stacklevel=2)
            return
        if self._live_reducer is not None:
            self._live_reducer.set_static_graph()  # refused once it has reduced gradients
        self.static_graph = True
        self._ddp_log.data["static_graph"] = 1  # as torch's logging data
        self._options["static_graph"] = True  # a copy's reducer too; See Note [Static graph]

    @property
    def zero(self) -> int:
        return self._reducer.zero

    def shape_of(self, p: torch.Tensor) -> torch.Size:
        """A parameter's whole shape (zero=3's FullyShardedModel knows it while the parameter's data is empty)."""
        return p.shape

    def dtype_of(self, p: torch.Tensor) -> torch.dtype:
        """A parameter's own dtype (under zero=3 its shard's)."""
        return p.dtype

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch's; with zero=1|2 the gradients are zeroed in place in their buckets (or shards)."""
        if self.zero == 0:
            super().zero_grad(set_to_none)
        else:
            self._reducer.zero_grad(set_to_none)

    def _apply(self, fn: Any, recurse: bool = True) -> DistributedModel:
        """What .to(), .cuda(), .half(), ... do to a wrapped model. The reducer, the buckets and the ZeRO
        shards hold the parameters' storage, so a conversion that would give a parameter or buffer a new one
        is refused, before anything moves: the gradients of the moved copies would no longer be averaged.
        One that leaves each tensor's device and dtype as they are (accelerate's .to("cpu:0") of a CPU model,
        which torch carries out as a copy) is left undone."""
        kinds = {(t.device, t.dtype) for t in (*self.parameters(), *self.buffers())}
        same: set[tuple[torch.device, torch.dtype]] = set()
        for device, dtype in kinds:
            probe = torch.empty(0, device=device, dtype=dtype)
            out = fn(probe)
            if out is probe:
                continue  # in place, or nothing to do
            if out.device == probe.device and out.dtype == dtype:
                same.add((device, dtype))
                continue
            raise _C.ConfigError(
                f"{type(self).__name__} (dtcore.wrap, zero={self.zero}): converting its {dtype} tensors on {device} "
                f"to {out.dtype} on {out.device} (.to(), .cuda(), .half(), ...) after wrapping. Its gradient buckets"
                f"{' and shards' if self.zero else ''} hold the parameters where they are: the moved copies' "
                "gradients would not be averaged. Fix: move or convert the module before dtcore.wrap (dtcore.init() "
                "chose the device: ctx.device)."
            )
        if not same:
            return super()._apply(fn, recurse)
        return super()._apply(lambda t: t if (t.device, t.dtype) in same else fn(t), recurse)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Forward and backward passes inside accumulate locally; the next synced one reduces the sum."""
        previous, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    @property
    def bucket_params(self) -> list[list[int]]:
        return self._reducer.bucket_params()

    def bucket_plan_state(self) -> dict[str, Any] | None:
        """With bucket_mb="auto", once the plan is chosen: what a checkpoint keeps of it (the parameters'
        names by bucket, and the world size it was measured at); None otherwise."""
        reducer = self._reducer
        if not self._options.get("auto_buckets") or not (reducer.auto_plan_info()["chosen"] or self._plan_adopted):
            return None
        names = self._trainable_names  # by the reducer's indices
        return {"world_size": self._comm.size, "buckets": [[names[i] for i in b] for b in self.bucket_params]}

    def adopt_bucket_plan(self, state: dict[str, Any] | None) -> bool:
        """A checkpoint's bucket_plan_state() becomes this model's plan, so that it is not measured again:
        with bucket_mb="auto", before the first reduced backward, when the world size and the trainable
        parameters are the same (else this model measures its own). True when adopted. Every rank alike."""
        reducer = self._reducer
        if not state or not self._options.get("auto_buckets") or reducer.plan_final:
            return False
        index = {n: i for i, n in enumerate(self._trainable_names)}
        saved = [name for bucket in state["buckets"] for name in bucket]
        if state["world_size"] != self._comm.size or sorted(saved) != sorted(index):
            return False
        reducer.adopt_plan([[index[n] for n in bucket] for bucket in state["buckets"]])
        self._plan_adopted = True
        return True


def bucket_options(bucket_mb: float | str) -> dict[str, Any]:
    """The reducer's options for a bucket_mb: a size in MiB, or "auto" (Note [Buckets that size themselves]),
    whose first plan uses the default caps.

    An auto plan comes from the first backward's timing, so two runs of one job may cut their buckets
    differently; a result whose rounding depends on where the buckets end (a ring all-reduce of more
    than 2 ranks, Gloo's over TCP or NCCL's; the clip norm summed over zero=2's shards) then differs in
    its last bits between the runs (dtcore's shared-memory collectives reduce in rank order whatever
    the layout, so on one host only zero=2's norm does). A process that asked torch for deterministic
    algorithms (torch.use_deterministic_algorithms(True), which Lightning's deterministic=True and
    transformers' full_determinism set) wants two runs to agree bit for bit: "auto" then takes the
    default caps and says so, as torch's cudnn.benchmark, a choice by timing too, yields to them."""
    if isinstance(bucket_mb, str):
        if bucket_mb != "auto":
            raise _C.ConfigError(
                f"bucket_mb={bucket_mb!r} is neither a size in MiB nor 'auto'. Fix: bucket_mb='auto' (measured), or a "
                "number such as 25."
            )
        if torch.are_deterministic_algorithms_enabled():
            _log.info(
                "bucket_mb=auto takes fixed %g MiB buckets: torch.use_deterministic_algorithms(True) is set, and a "
                "plan measured from timing may cut differently in another run (give bucket_mb a size to choose it)",
                _DEFAULTS.bucket_mb,
            )
            return {"bucket_mb": _DEFAULTS.bucket_mb, "auto_buckets": False, "auto_fixed": True}
        return {"bucket_mb": _DEFAULTS.bucket_mb, "auto_buckets": True}
    return {"bucket_mb": bucket_mb, "auto_buckets": False}


def _default_group() -> Any:
    """torch.distributed's default group, the whole job (torch DDP's process_group), or None without one."""
    return dist.group.WORLD if dist.is_initialized() else None
