"""PyTorch's own DDP tests, run with torch's DistributedDataParallel and with dtcore's in its place.

    python benchmarks/torch_ddp_tests.py [--only PATTERN] [--impl both|torch|dtcore] [--jobs N]

The tests are those of `torch/testing/_internal/distributed/distributed_test.py` (shipped in the
torch wheel) that build a DistributedDataParallel: the ones whose names contain "ddp" or
"DistributedDataParallel" ("named"), and the others whose body, or a helper of the test class it
calls, names DistributedDataParallel (most of them gated on 2 GPUs, as the named ones), driven as upstream's
`test/distributed/test_distributed_spawn.py` drives them: backend gloo, 2 ranks, each test in
freshly spawned processes that join a default group through a file:// init method. The gate
that skips a test without 2 GPUs (`skip_if_lt_x_gpu`) runs it on CPU instead, as its own
`allow_cpu=True` does; tests that really need CUDA then fail alike for both implementations.

With `--impl dtcore`, every spawned rank attaches dtcore to the default group right after
`init_process_group` (dtcore.init on that group's store) and `DistributedDataParallel` is
dtcore's class wherever the tests name it. Each batch of tests runs in a process of its own
(this script with --worker), with its own temporary directory, a timeout per test (torch's
harness, DISTRIBUTED_TESTS_DEFAULT_TIMEOUT) and one for the batch.

The table lists the tests torch passes, how many dtcore passes, and for each test torch passes
and dtcore does not, the first line of dtcore's failure. Two tallies close it: the named tests
alone, and all of them.

torch's test utilities import `expecttest`, which torch's wheel does not install:
`pip install expecttest==0.3.0` first.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

WORLD_SIZE = 2
_IMPL_VAR = "TORCH_DDP_TESTS_IMPL"  # read by the spawned ranks, which import this file again
_START_VAR = "TORCH_DDP_TESTS_START"  # spawn (upstream's) or fork


def _import_tests():
    """distributed_test's test base, with the 2-GPU gate run on CPU and, for dtcore, dtcore in DDP's place."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal import common_distributed

    gate = common_distributed.skip_if_lt_x_gpu

    def skip_if_lt_x_gpu(x, *, allow_cpu=False):
        return gate(x, allow_cpu=True)

    common_distributed.skip_if_lt_x_gpu = skip_if_lt_x_gpu  # before distributed_test applies it
    for name in common_distributed.TIMEOUT_OVERRIDE:  # --timeout for every test, upstream's longer ones too
        common_distributed.TIMEOUT_OVERRIDE[name] = common_distributed.TIMEOUT_DEFAULT
    if os.environ.get(_IMPL_VAR) == "dtcore":
        import dtcore

        _attach_dtcore(dist)
        base = dtcore.DistributedDataParallel
    else:
        base = torch.nn.parallel.DistributedDataParallel
    ddp = _on_cpu(torch, base)
    torch.nn.parallel.DistributedDataParallel = ddp
    from torch.testing._internal.distributed import distributed_test

    distributed_test.DistributedDataParallel = ddp  # its own `from torch.nn.parallel import ...`
    return distributed_test


def _on_cpu(torch, base):
    """The 2-GPU gate on CPU: the tests' GPU devices (cuda:<rank>, or the rank as a device index)
    become the CPU, for both implementations alike. A TorchFunctionMode rewrites devices in tensor
    factories and .to()/.cuda(); torch.cuda's device calls do nothing; the DDP class drops
    device_ids/output_device, which torch's refuses for a CPU module. Returns that DDP class."""
    from torch.overrides import TorchFunctionMode

    def cpu(device):
        if isinstance(device, int) and not isinstance(device, bool):
            return torch.device("cpu")
        if isinstance(device, str) and device.startswith("cuda"):
            return torch.device("cpu")
        if isinstance(device, torch.device) and device.type == "cuda":
            return torch.device("cpu")
        return device

    class CudaOnCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func is torch.Tensor.cuda:
                return args[0]
            if "device" in kwargs:
                kwargs["device"] = cpu(kwargs["device"])
            if func is torch.Tensor.to and len(args) > 1:
                args = (args[0], cpu(args[1]), *args[2:])
            if func is torch._C._nn._parse_to and args:  # Module.to(device)
                args = (cpu(args[0]), *args[1:])
            return func(*args, **kwargs)

    CudaOnCpu().__enter__()  # for the whole process (the ranks' main threads)
    torch.cuda.set_device = lambda device: None
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.current_device = lambda: 0

    class DistributedDataParallel(base):
        def __init__(self, module, device_ids=None, output_device=None, *args, **kwargs):
            super().__init__(module, None, None, *args, **kwargs)

    globals()["DistributedDataParallel"] = DistributedDataParallel  # where pickle finds it (torch.save(model))
    DistributedDataParallel.__module__ = __name__
    DistributedDataParallel.__qualname__ = "DistributedDataParallel"
    return DistributedDataParallel


def _attach_dtcore(dist) -> None:
    """Each rank attaches dtcore to the default group the test sets up (and detaches when it ends)."""
    import dtcore

    init_process_group, destroy_process_group = dist.init_process_group, dist.destroy_process_group

    def init_and_attach(*args, **kwargs):
        init_process_group(*args, **kwargs)
        if dtcore.is_initialized():  # a test that set up a second default group
            dtcore.shutdown(barrier=False)
        timeout = kwargs.get("timeout")
        dtcore.init(
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            timeout=timeout.total_seconds() if timeout is not None else None,
        )

    def detach_and_destroy(group=None):
        if group is None or group is dist.group.WORLD:
            dtcore.shutdown(barrier=False)
        destroy_process_group(group)

    dist.init_process_group, dist.destroy_process_group = init_and_attach, detach_and_destroy


def ddp_test_names(pattern: str | None = None) -> dict[str, bool]:
    """The DDP tests of DistributedTest._DistTestBase, read from its source (importing it takes long):
    the methods its class body defines (not those in strings: upstream comments some tests out so)
    that are named for DDP or reach DistributedDataParallel, directly or through the class's own
    helpers (self._test_...). Each name maps to whether it is named for DDP."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("torch.testing._internal.distributed.distributed_test")
    with open(spec.origin) as f:
        tree = ast.parse(f.read())
    outer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DistributedTest")
    base = next(n for n in outer.body if isinstance(n, ast.ClassDef) and n.name == "_DistTestBase")
    methods = {n.name: n for n in base.body if isinstance(n, ast.FunctionDef)}

    def reaches_ddp(name: str, seen: set[str]) -> bool:
        seen.add(name)
        for node in ast.walk(methods[name]):
            if isinstance(node, ast.Name) and node.id == "DistributedDataParallel":
                return True
            if isinstance(node, ast.Attribute):
                if node.attr == "DistributedDataParallel":
                    return True
                helper = isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr in methods
                if helper and node.attr not in seen and reaches_ddp(node.attr, seen):
                    return True
        return False

    found = {}
    for name in sorted(methods):
        if not name.startswith("test_") or (pattern is not None and not re.search(pattern, name)):
            continue
        named = "ddp" in name.lower() or "distributeddataparallel" in name.lower()
        if named or reaches_ddp(name, set()):
            found[name] = named
    return found


# --- worker: one batch of tests in this process, results as JSON lines -----------------------


def _first_line(text: str) -> str:
    """The exception a rank raised ("Error: message"): the first unindented line after the first
    traceback inside a rank's report (torch's harness nests it in its own RuntimeError)."""
    marker = re.search(r"exited with error code \d+ and exception:\n", text)
    body = text[marker.end() :] if marker else text
    lines = body.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Traceback"):
            for later in lines[i + 1 :]:
                if later.strip() and not later[0].isspace():
                    return later[:200]
    found = [line for line in lines if line.strip()]
    return found[-1][:200] if found else "?"


def _worker(names: list[str], out_path: str) -> None:
    import unittest

    expanded = []
    for name in names:  # a parametrized test exists only under its generated names (name_param_value)
        generated = (
            []
            if hasattr(TestDistBackendWithSpawn, name)
            else sorted(a for a in dir(TestDistBackendWithSpawn) if a.startswith(name + "_"))
        )
        expanded += generated or [name]
    with open(out_path, "a") as out:
        for name in expanded:
            started = time.monotonic()
            result = unittest.TestResult()
            try:
                TestDistBackendWithSpawn(name).run(result)
            except Exception:  # the test could not even be set up: its failure, not the batch's
                import traceback

                result.errors.append((name, traceback.format_exc()))
            detail = ""
            if result.errors or result.failures:
                detail = (result.errors + result.failures)[0][1]
                status, why = "fail", _first_line(detail)
            elif result.skipped:
                status, why = "skip", result.skipped[0][1].splitlines()[0][:200]
            else:
                status, why = "pass", ""
            seconds = round(time.monotonic() - started, 1)
            record = {"test": name, "status": status, "why": why, "seconds": seconds, "detail": detail[-6000:]}
            out.write(json.dumps(record) + "\n")
            out.flush()


# In a worker and in the ranks it spawns (which import this file again, as __mp_main__): the test
# class, as upstream's test_distributed_spawn.py declares it.
if os.environ.get(_IMPL_VAR):
    _distributed_test = _import_tests()

    class TestDistBackendWithSpawn(_distributed_test.TestDistBackend, _distributed_test.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            if os.environ.get(_START_VAR) == "fork":  # faster: the ranks need not import torch again
                import torch.multiprocessing

                self._start_processes(torch.multiprocessing.get_context("fork").Process)
            else:
                self._spawn_processes()

    from torch.testing._internal.common_utils import instantiate_parametrized_tests

    instantiate_parametrized_tests(TestDistBackendWithSpawn)  # as upstream: test_x_param_value


# --- driver --------------------------------------------------------------------------------


def _run_batches(impl: str, names: list[str], jobs: int, timeout: float, start: str) -> dict[str, dict]:
    """Runs `names` in `jobs` worker processes at once; a batch past its time is killed, and its
    unfinished tests are reported as timed out."""
    batches = [names[i::jobs] for i in range(jobs) if names[i::jobs]]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="torch-ddp-tests-") as tmp:
        procs = []
        for i, batch in enumerate(batches):
            temp_dir = os.path.join(tmp, f"{impl}-{i}")
            os.makedirs(temp_dir)
            out_path = os.path.join(tmp, f"{impl}-{i}.jsonl")
            env = dict(os.environ, **{_IMPL_VAR: impl, _START_VAR: start})
            env["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(int(timeout))
            # What distributed_test.py reads at import and in its ranks (upstream's run_test.py sets the same).
            env.update(BACKEND="gloo", WORLD_SIZE=str(WORLD_SIZE), TEMP_DIR=temp_dir, OMP_NUM_THREADS="1")
            env.pop("INIT_METHOD", None)  # the default: each test's own file://
            for var in ("RANK", "LOCAL_RANK", "MASTER_PORT"):  # a launcher's, not the tests'
                env.pop(var, None)
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", out_path, *batch]
            log = open(os.path.join(tmp, f"{impl}-{i}.log"), "w")
            p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            procs.append((p, batch, out_path, time.monotonic() + timeout * len(batch) + 60, log))
        for p, batch, out_path, deadline, log in procs:
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            log.close()
            with open(log.name) as f:
                crash = _first_line(f.read()[-20000:])  # what ended the batch, if it did not finish
            if os.path.exists(out_path):
                with open(out_path) as f:
                    for line in f:
                        record = json.loads(line)
                        results[record["test"]] = record
            for name in batch:
                if not any(t == name or t.startswith(name + "_") for t in results):
                    results[name] = {"test": name, "status": "fail", "why": f"batch timed out or crashed: {crash}"}
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="a regular expression: run the DDP tests whose names match it")
    parser.add_argument("--impl", choices=("both", "torch", "dtcore"), default="both")
    parser.add_argument("--jobs", type=int, default=2, help="test batches run at once (default 2)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per test (default 120)")
    parser.add_argument(
        "--start",
        choices=("spawn", "fork"),
        default="spawn",
        help="how each test's ranks start: spawn (upstream's, the default) or fork (faster, for iterating)",
    )
    parser.add_argument("--json", help="also write every result to this file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: a batch's result file
    parser.add_argument("tests", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        _worker(args.tests, args.worker)
        return 0

    try:
        import expecttest  # noqa: F401  (torch's test utilities need it; a worker would fail on each test)
    except ImportError:
        print("torch's test utilities need expecttest. Fix: pip install expecttest==0.3.0", file=sys.stderr)
        return 2
    named = ddp_test_names(args.only)
    names = sorted(named)
    if not names:
        print(f"no DDP test matches {args.only!r}", file=sys.stderr)
        return 2
    started = time.monotonic()
    impls = ["torch", "dtcore"] if args.impl == "both" else [args.impl]
    runs = {impl: _run_batches(impl, names, args.jobs, args.timeout, args.start) for impl in impls}
    seconds = time.monotonic() - started
    names = sorted(set().union(*(runs[impl] for impl in impls)))
    missing = {"status": "fail", "why": "not run (its batch ended before it)"}
    for impl in impls:
        for name in names:
            runs[impl].setdefault(name, dict(missing, test=name))

    width = max(len(n) for n in names)
    print(f"{'test':<{width}}  " + "  ".join(f"{impl:<6}" for impl in impls) + "  dtcore's first failure line")
    for name in names:
        cells = [runs[impl][name]["status"] for impl in impls]
        why = ""
        if "dtcore" in runs and runs["dtcore"][name]["status"] != "pass":
            if "torch" not in runs or runs["torch"][name]["status"] == "pass":
                why = runs["dtcore"][name]["why"]
        print(f"{name:<{width}}  " + "  ".join(f"{c:<6}" for c in cells) + f"  {why}")
    print()

    def is_named(test: str) -> bool:  # a parametrized test's generated name starts with its method's
        return any(test == n or test.startswith(n + "_") for n, by_name in named.items() if by_name)

    tallies = {"named for DDP": [n for n in names if is_named(n)], "every test that builds a DDP": names}
    for what, tests in tallies.items():
        print(f"{what} ({len(tests)}):")
        for impl in impls:
            passed = sum(runs[impl][n]["status"] == "pass" for n in tests)
            print(f"  {impl}: {passed} of {len(tests)} pass")
        if "torch" in runs and "dtcore" in runs:
            torch_passes = [n for n in tests if runs["torch"][n]["status"] == "pass"]
            both = sum(runs["dtcore"][n]["status"] == "pass" for n in torch_passes)
            print(f"  dtcore passes {both} of the {len(torch_passes)} that torch passes")
    print(f"({seconds:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
