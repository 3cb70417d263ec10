"""`--training.compile=true` on 2 CPU ranks (Gloo), with backend aot_eager (AOTAutograd's graphs
without code generation: what dynamo, the graph split at bucket boundaries and autograd do is
inductor's, in a fraction of the time). The compiled run logs the same losses as the eager one bit
for bit, compiles one training graph and one evaluation graph (none after them, no_sync micro-batches
included), resumes from its checkpoint to the same losses, and zero=3 compiles its units."""

import json
import sys

import pytest

from launch_helpers import clean_env, describe, free_port, leftover_processes, run_processes, torchrun_style

pytestmark = pytest.mark.multirank

# 2 micro-batches of 8 per rank and step (the first under no_sync), an evaluation and a checkpoint every 4 steps.
ARGS = ["--preset", "tiny", "--num_iterations=8", "--total_batch_size=32", "--eval_every=4", "--checkpoint.every=4"]
ARGS += ["--logging.progress=false", "--logging.plot=false", "--logging.tensorboard=false"]
COMPILED = ["--training.compile=true", "--training.compile_backend=aot_eager"]
TRACED = "torchdynamo start tracing forward"  # dynamo's log line (TORCH_LOGS=dynamo) for each graph it traces


def _train(run_dir, *args):
    """python -m dtcore.train on 2 ranks; each rank's stderr."""
    port = free_port()
    cmd = [sys.executable, "-m", "dtcore.train", *ARGS, f"--logging.run_dir={run_dir}", *args]
    envs = [clean_env(TORCH_LOGS="dynamo", **torchrun_style(rank, 2, port)) for rank in range(2)]
    results, sessions = run_processes([cmd] * 2, envs, timeout=180)
    assert [r.returncode for r in results] == [0, 0], describe(results)
    assert leftover_processes(sessions) == []
    return [r.stderr for r in results]


def _losses(run_dir, rank):
    """{(kind, step): loss} of a rank's metrics file."""
    lines = [json.loads(line) for line in (run_dir / "metrics" / f"rank{rank}.jsonl").read_text().splitlines()]
    return {(j["kind"], j["step"]): j.get("loss", j.get("eval_loss")) for j in lines}


def _traced(stderr, where):
    return [line for line in stderr.splitlines() if TRACED in line and where in line]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{name: (run_dir, [stderr of rank 0, of rank 1])}: eager, compiled, compiled resumed from step 4,
    and compiled with zero=3."""
    root = tmp_path_factory.mktemp("compile")
    out = {"eager": (root / "eager", _train(root / "eager"))}
    out["compiled"] = (root / "compiled", _train(root / "compiled", *COMPILED))
    checkpoint = root / "compiled" / "checkpoints" / "step_00000004"
    out["resumed"] = (root / "resumed", _train(root / "resumed", *COMPILED, f"--checkpoint.resume={checkpoint}"))
    out["zero3"] = (root / "zero3", _train(root / "zero3", *COMPILED, "--parallel.zero=3"))
    return out


def test_the_compiled_run_logs_the_eager_runs_losses_bit_for_bit(runs):
    for rank in (0, 1):
        eager, compiled = _losses(runs["eager"][0], rank), _losses(runs["compiled"][0], rank)
        assert len(eager) == 8 + 2 and compiled == eager  # 8 steps, 2 evaluations
        assert eager[("train", 8)] < eager[("train", 1)] - 0.3, eager  # and it learns


def test_one_training_graph_and_one_evaluation_graph_are_compiled(runs):
    for stderr in runs["compiled"][1]:
        # GPT.forward traced twice: with grad in train mode (every step, no_sync or not), then under
        # no_grad in eval mode; nothing traced again after that
        assert len(_traced(stderr, "demo/gpt.py")) == 2, _traced(stderr, "")
    assert not any(_traced(stderr, "") for stderr in runs["eager"][1])
    assert "training.compile: torch.compile(backend='aot_eager') compiles the model" in runs["compiled"][1][0]


def test_the_compiled_run_resumes_from_its_checkpoint_to_the_same_losses(runs):
    for rank, stderr in enumerate(runs["resumed"][1]):
        resumed, whole = _losses(runs["resumed"][0], rank), _losses(runs["compiled"][0], rank)
        assert min(step for _, step in resumed) == 5 and resumed == {k: v for k, v in whole.items() if k[1] > 4}
        assert len(_traced(stderr, "demo/gpt.py")) == 2
    assert "resumed from" in runs["resumed"][1][0] and "at step 4" in runs["resumed"][1][0]


def test_zero3_compiles_each_unit_and_trains_as_the_eager_run(runs):
    for rank, stderr in enumerate(runs["zero3"][1]):
        assert _traced(stderr, "demo/gpt.py"), stderr[-3000:]  # each block's forward (Note [zero=3 and torch.compile])
        eager, zero3 = _losses(runs["eager"][0], rank), _losses(runs["zero3"][0], rank)
        assert zero3.keys() == eager.keys()
        assert all(zero3[k] == pytest.approx(eager[k], rel=1e-6) for k in eager), (zero3, eager)
