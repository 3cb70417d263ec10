"""Finding the blocks to checkpoint: the repeated layers of a model.

By default the repeated layers, see Note [Block discovery]. Or given: a class, a class name, or
qualified names / fnmatch patterns. Only the outermost matching modules count (a pattern "blocks.*"
gives blocks.0, blocks.1, ..., not their children), and never the model itself.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from typing import Any

import torch

from .. import _C

# Note [Block discovery]
# The blocks are a model's repeated layers: a run of consecutive sibling modules of one class that
# hold parameters. Composite runs come first, then the longest, then the one with more parameters,
# then the shallower one. A block is composite when its parameters sit in at least two of its
# submodules (attention and MLP, a Linear and a LayerNorm): a transformer layer is, one attention's
# q/k/v/o projections or the word/position/token-type embeddings are not, and on a shallow model
# (BERT or Llama with 2 layers) those leaf runs are as long as or longer than the layers. In a
# ModuleList or ModuleDict (a container that only lists layers, never a model's own forward) one
# composite layer is a run too, so that a 1-layer model checkpoints its layer; elsewhere a run needs
# two siblings (a Sequential of two different stages is not one).


# A parameter's number of elements: Tensor.numel, or a wrapper's, where its data is not all here (zero=3's
# FullyShardedModel: DistributedModel.shape_of).
Numel = Callable[[torch.Tensor], int]


def _params(m: torch.nn.Module, numel: Numel) -> int:
    return sum(numel(p) for p in m.parameters())


def _composite(m: torch.nn.Module) -> bool:
    holders = 0
    for sub in m.modules():
        if sub is not m and next(sub.parameters(recurse=False), None) is not None:
            holders += 1
            if holders == 2:
                return True
    return False


def repeated_runs(root: torch.nn.Module, numel: Numel = torch.Tensor.numel) -> list[list[tuple[str, torch.nn.Module]]]:
    """Every candidate run of blocks, best first; see Note [Block discovery]."""
    runs = []
    for parent_name, parent in root.named_modules():
        lists_layers = isinstance(parent, (torch.nn.ModuleList, torch.nn.ModuleDict))
        run: list[tuple[str, torch.nn.Module]] = []
        for child_name, child in list(parent.named_children()) + [("", None)]:  # None closes the last run
            if run and (child is None or type(child) is not type(run[0][1])):
                first = run[0][1]
                if _params(first, numel) > 0 and (len(run) >= 2 or (lists_layers and _composite(first))):
                    runs.append(run)
                run = []
            if child is not None:
                run.append((f"{parent_name}.{child_name}" if parent_name else child_name, child))
    runs.sort(
        key=lambda r: (not _composite(r[0][1]), -len(r), -sum(_params(m, numel) for _, m in r), r[0][0].count("."))
    )
    return runs


def _describe_runs(root: torch.nn.Module, numel: Numel) -> str:
    runs = repeated_runs(root, numel)[:3]
    if not runs:
        return (
            "no run of sibling modules of one class with parameters, nor a single layer in a ModuleList or ModuleDict"
        )
    return "; ".join(
        f"{len(r)} x {type(r[0][1]).__name__} ({r[0][0]}{f' .. {r[-1][0]}' if len(r) > 1 else ''})" for r in runs
    )


def _outermost(found: list[tuple[str, torch.nn.Module]]) -> list[tuple[str, torch.nn.Module]]:
    out: list[tuple[str, torch.nn.Module]] = []
    for name, m in found:  # named_modules() order: a parent comes before its children
        if not any(name.startswith(kept + ".") for kept, _ in out):
            out.append((name, m))
    return out


def find_blocks(
    root: torch.nn.Module, blocks: Any = None, numel: Numel = torch.Tensor.numel
) -> list[tuple[str, torch.nn.Module]]:
    """(qualified name, module) of each block in forward-registration order; ConfigError if none."""
    named = [(n, m) for n, m in root.named_modules() if n]  # never the model itself
    model = type(root).__name__
    if blocks is None:
        runs = repeated_runs(root, numel)
        if not runs:
            raise _C.ConfigError(
                f"checkpoint_activations found no repeated blocks in {model}: no two consecutive sibling modules "
                "of one class hold parameters, nor does a ModuleList or ModuleDict hold one layer with parameters in "
                "two of its submodules. Fix: name the blocks, e.g. blocks=MyLayer, blocks='MyLayer' or "
                "blocks=['encoder', 'decoder']."
            )
        return runs[0]
    if isinstance(blocks, type):
        found = [(n, m) for n, m in named if isinstance(m, blocks)]
        what = f"blocks={blocks.__name__}"
    elif isinstance(blocks, str) and any(type(m).__name__ == blocks for _, m in named):
        found = [(n, m) for n, m in named if type(m).__name__ == blocks]
        what = f"blocks='{blocks}'"
    elif isinstance(blocks, (str, list, tuple)) and all(
        isinstance(b, str) for b in ([blocks] if isinstance(blocks, str) else blocks)
    ):
        patterns = [blocks] if isinstance(blocks, str) else list(blocks)
        found = [(n, m) for n, m in named if any(n == p or fnmatch.fnmatchcase(n, p) for p in patterns)]
        what = f"blocks={blocks!r}"
        missing = [p for p in patterns if not any(n == p or fnmatch.fnmatchcase(n, p) for n, _ in named)]
        if found and missing:
            raise _C.ConfigError(
                f"{what}: {missing!r} match no module of {model}. Fix: check the names against model.named_modules()."
            )
    else:
        raise _C.ConfigError(
            f"blocks={blocks!r} is not a way to name blocks. Fix: pass a module class, a class "
            "name, or a list of qualified module names or patterns such as 'layers.*'."
        )
    found = _outermost(found)
    if not found:
        raise _C.ConfigError(
            f"{what} matches no module of {model}. Repeated blocks found: {_describe_runs(root, numel)}. Fix: pass a "
            "class or class name present in the model, or qualified names as in model.named_modules() (patterns "
            "such as 'layers.*' allowed)."
        )
    return found
