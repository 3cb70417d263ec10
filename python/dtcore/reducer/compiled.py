"""DistributedModel under torch.compile: what dynamo is told so that the compiled backward overlaps.

Note [dtcore under torch.compile]: the reducer hooks each parameter's AccumulateGrad node (csrc/
dtcore/reducer/reducer.h). A compiled forward is one autograd node whose backward hands every
gradient to those nodes at its end, so no bucket could start before the whole backward had run.
torch DDP meets this with dynamo's DDPOptimizer, and dtcore uses the same cue: while the wrapped
module runs, torch's DistributedDataParallel._active_ddp_module names the model, and dynamo splits
each graph it compiles there into pieces of about one bucket's worth of parameters (reverse graph
order, a small first piece). Each piece is an autograd node of its own, so its parameters' hooks
fire when its backward ends, and their buckets go while earlier pieces still compute.

The wrapper's forward itself is never traced (torch.compiler.disable(recursive=False), through
torch's lazy torch._disable_dynamo, as torch DDP's: torch.compiler.disable at class definition would
import dynamo, seconds, with `import dtcore`): its bookkeeping (arming the reducer, buffer
broadcasts, timings, the unused-parameter search) runs eagerly in functions dynamo skips whole, and
the module's frames beneath it are compiled. So torch.compile(dtcore.wrap(m)),
dtcore.wrap(torch.compile(m)) and model.compile() give the same graphs, with no graph break in
dtcore's code.

Dynamo's first piece holds at least torch's first bucket size (1 MiB), and it refuses a cap below
that; a model whose bucket_mb is smaller is split into 1 MiB pieces (its buckets still go as soon
as their piece's backward ends). bucket_mb="auto" splits at the default cap (25 MiB), the graphs
being compiled before its plan is chosen; the plan then cuts where the pieces' gradients arrive.

Dynamo's cache does not key on the cue: a module class compiled plain earlier in the process (before
it was wrapped) runs its cached, unsplit graph in the wrapper too, and overlaps nothing. torch DDP
behaves the same. Compile after wrapping, or call torch._dynamo.reset() in between.
"""

from __future__ import annotations

from typing import Any

import torch

_TorchDDP = torch.nn.parallel.DistributedDataParallel


class _SplitCue:
    """What dynamo reads of the active DDP module (its bucket cap), for caps below its first piece's."""

    def __init__(self, bucket_bytes_cap: int) -> None:
        self.bucket_bytes_cap = bucket_bytes_cap


class SplittingGraphs:
    """While `model.module` runs: graphs dynamo compiles are split at bucket boundaries. Never traced
    itself (its methods are skipped whole, as the wrapper's bookkeeping)."""

    @torch._disable_dynamo
    def __init__(self, model: Any) -> None:
        self._model = model
        self._previous: Any = None

    @torch._disable_dynamo
    def __enter__(self) -> None:
        first = getattr(torch.distributed, "_DEFAULT_FIRST_BUCKET_BYTES", 2**20)
        cap = self._model.bucket_bytes_cap
        self._previous = _TorchDDP._active_ddp_module
        _TorchDDP._active_ddp_module = self._model if cap >= first else _SplitCue(first)

    @torch._disable_dynamo
    def __exit__(self, *exc: object) -> None:
        _TorchDDP._active_ddp_module = self._previous
