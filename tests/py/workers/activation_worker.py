"""One rank: dtcore.wrap of a checkpointed GPT against one process on the whole batch.

    activation_worker.py POLICY        (all | selective | budget)

Two micro-batches inside no_sync() then one synced: every rank's gradients must equal those of a
plain model on the whole batches (dropout off, so that the shards and the whole batch see the same
function); and a checkpointed wrapped model with dropout on must give exactly the gradients of a
wrapped one without checkpointing (the same masks, replayed). With "budget", ranks profiling
different inputs must still choose the same plan, and an infeasible budget raises on all of them.
"""

import copy
import dataclasses
import json
import sys

import torch

import dtcore
from dtcore.train.demo.gpt import GPT, GPTConfig

CONFIG = GPTConfig(vocab_size=32, block_size=16, n_layer=3, n_head=2, n_embd=32, dropout=0.0)


def policy_for(model, name, x, y):
    if name != "budget":
        return name
    base = dtcore.checkpoint_activations(model, "all", example_inputs=(x, y)).baseline_peak_bytes
    return f"budget:{int(base * 0.7)}"


def uneven_ranks(r: int) -> dict:
    """One budget, different example inputs per rank (2 rows here, 8 there): the ranks must plan alike."""
    torch.manual_seed(0)
    probe = GPT(CONFIG)
    x, y = torch.randint(0, 32, (2, 8, 16), generator=torch.Generator().manual_seed(11))
    rows = 2 if r == 0 else 8
    whole = dtcore.checkpoint_activations(probe, "all", example_inputs=(x, y))  # 8 rows, the same on every rank
    plan = dtcore.checkpoint_activations(
        probe, f"budget:{int(whole.baseline_peak_bytes * 0.7)}", example_inputs=(x[:rows], y[:rows])
    )
    out = {"uneven_modes": [b.mode for b in plan.blocks]}
    # Feasible with 2 rows, not with 8: every rank raises, none waits for the others.
    try:
        dtcore.checkpoint_activations(
            probe, f"budget:{int(whole.predicted_peak_bytes * 0.9)}", example_inputs=(x[:rows], y[:rows])
        )
        out["infeasible"] = "planned"
    except dtcore.ConfigError as e:
        out["infeasible"] = "ConfigError" if "cannot be met" in str(e) else str(e)
    return out


def main() -> None:
    name = sys.argv[1]
    ctx = dtcore.init(timeout=60)
    n, r = ctx.world_size, ctx.rank
    torch.manual_seed(0)
    plain = GPT(CONFIG)
    reference = copy.deepcopy(plain)  # one process, whole batches
    data = torch.Generator().manual_seed(7)
    batches = [torch.randint(0, 32, (2, 8, 16), generator=data) for _ in range(3)]  # (x|y, B, T)
    shard = slice(r * 8 // n, (r + 1) * 8 // n)
    model = dtcore.wrap(copy.deepcopy(plain))
    summary = dtcore.checkpoint_activations(
        model,
        policy_for(model.module, name, batches[0][0][shard], batches[0][1][shard]),
        example_inputs=(batches[0][0][shard], batches[0][1][shard]),
    )
    bad = []
    for i, (x, y) in enumerate(batches):
        if i < 2:
            with model.no_sync():
                model(x[shard], y[shard]).backward()
        else:
            model(x[shard], y[shard]).backward()
        (reference(x, y) / 1).backward()
    for (pname, p), q in zip(model.module.named_parameters(), reference.parameters()):
        if not torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-6):
            bad.append(f"{pname}: max diff {(p.grad - q.grad).abs().max().item():.3g}")

    # Dropout on: checkpointed and not, both wrapped, the same seed per rank: equal bit for bit.
    dropout = GPT(dataclasses.replace(CONFIG, dropout=0.2))
    a, b = dtcore.wrap(copy.deepcopy(dropout)), dtcore.wrap(copy.deepcopy(dropout))
    dtcore.checkpoint_activations(a, name if name != "budget" else "every:2")
    x, y = batches[0]
    for m in (a, b):
        torch.manual_seed(100 + r)
        m(x[shard], y[shard]).backward()
    for (pname, p), q in zip(a.module.named_parameters(), b.module.parameters()):
        if not torch.equal(p.grad, q.grad):
            bad.append(f"dropout {pname}: checkpointed and plain differ")
    report = {"rank": r, "bad": bad, "checkpointed": len(summary.checkpointed), "policy": summary.policy}
    if name == "budget":
        report.update(uneven_ranks(r))
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    dtcore.shutdown()


if __name__ == "__main__":
    main()
