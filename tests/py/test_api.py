"""The public API in one process (world of one): lifecycle, arguments, errors, seeding, logging."""

import logging
import os
import pathlib
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import dtcore


def test_init_is_idempotent_and_shutdown_resets(fresh_dtcore):
    ctx = dtcore.init(timeout=30)
    assert dtcore.is_initialized()
    assert dtcore.init() is ctx
    assert dtcore.get_context() is ctx
    assert (ctx.rank, ctx.world_size, ctx.backend, ctx.launcher) == (0, 1, "gloo", "single")
    assert ctx.device == torch.device("cpu")
    assert ctx.master_port > 0  # a free port was chosen
    assert ctx.is_main_process and dtcore.is_main_process()
    assert dist.is_initialized()
    dtcore.shutdown()
    assert not dtcore.is_initialized()
    assert not dist.is_initialized()  # the default group dtcore created is gone too
    with pytest.raises(dtcore.ConfigError, match="not initialized"):
        dtcore.get_context()


def test_repeated_init_with_different_arguments_is_refused(fresh_dtcore):
    dtcore.init(timeout=30)
    with pytest.raises(dtcore.ConfigError, match="already initialized with backend 'gloo'"):
        dtcore.init(backend="nccl")
    with pytest.raises(dtcore.ConfigError, match=r"already initialized with rank=0; init\(rank=2\)"):
        dtcore.init(rank=2)


def test_shutdown_releases_everything_even_if_the_context_is_still_held(fresh_dtcore):
    from launch_helpers import free_port

    port = free_port()
    ctx = dtcore.init(timeout=30, master_port=port)
    assert ctx.master_port == port
    dtcore.shutdown()
    with pytest.raises(dtcore.CommError, match="closed"):
        ctx.communicator.all_reduce(torch.ones(1))
    again = dtcore.init(timeout=30, master_port=port)  # the port is free again
    assert again is not ctx and again.master_port == port
    assert torch.equal(dtcore.all_reduce(torch.ones(2)), torch.ones(2))


def test_repeated_init_with_the_same_arguments_returns_the_context(fresh_dtcore):
    ctx = dtcore.init(timeout=30, master_port=0)
    assert dtcore.init(master_port=0) is ctx  # a free port was asked for and chosen
    with pytest.raises(dtcore.ConfigError, match="unknown argument 'rnak'"):
        dtcore.init(rnak=1)


def test_torch_distributed_false_leaves_torch_alone(fresh_dtcore):
    dtcore.init(timeout=30, torch_distributed=False)
    assert not dist.is_initialized()
    t = torch.arange(4.0)
    assert torch.equal(dtcore.all_reduce(t), torch.arange(4.0))


def test_bad_arguments_name_value_and_fix(fresh_dtcore):
    with pytest.raises(dtcore.ConfigError, match=r"init\(backend=\)='mpi' is not a backend.*Fix"):
        dtcore.init(backend="mpi")
    with pytest.raises(dtcore.ConfigError, match=r"timeout=-1.*positive"):
        dtcore.init(timeout=-1)
    if not (torch.cuda.is_available() and dtcore._C.has_nccl):
        with pytest.raises(dtcore.ConfigError, match="backend='gloo'"):
            dtcore.init(backend="nccl")  # no CUDA or no NCCL: the error says what to use
    with pytest.raises(dtcore.ConfigError, match=r"init\(rank=\)=1 is outside 0..0"):
        dtcore.init(rank=1, world_size=1)
    assert not dtcore.is_initialized()


def test_env_knobs_are_read_and_checked(fresh_dtcore, monkeypatch):
    monkeypatch.setenv("DTCORE_TIMEOUT", "abc")
    with pytest.raises(dtcore.ConfigError, match="DTCORE_TIMEOUT"):
        dtcore.init()
    monkeypatch.setenv("DTCORE_TIMEOUT", "12.5")
    monkeypatch.setenv("DTCORE_BACKEND", "quic")
    with pytest.raises(dtcore.ConfigError, match="DTCORE_BACKEND='quic'"):
        dtcore.init()
    monkeypatch.setenv("DTCORE_BACKEND", "gloo")
    assert dtcore.init().timeout == 12.5


def test_collective_arguments_are_checked(fresh_dtcore):
    dtcore.init(timeout=30)
    with pytest.raises(dtcore.ConfigError, match="op='avg' needs a floating-point"):
        dtcore.all_reduce(torch.ones(2, dtype=torch.int64), op="avg")
    with pytest.raises(dtcore.ConfigError, match="op='prod' is not a reduction"):
        dtcore.all_reduce(torch.ones(2), op="prod")
    with pytest.raises(dtcore.ConfigError, match="not contiguous"):
        dtcore.all_reduce(torch.ones(4, 4).t())
    with pytest.raises(dtcore.ConfigError, match=r"src=3 is not a rank"):
        dtcore.broadcast(torch.ones(2), src=3)
    work = dtcore.all_reduce(torch.ones(3), async_op=True)
    with pytest.raises(dtcore.ConfigError, match="not a positive number of seconds"):
        work.wait(0)
    work.wait(10.0)
    assert work.is_completed()
    avg = torch.full((3,), 4.0)
    work = dtcore.all_reduce(avg, op="avg", async_op=True)
    while not work.is_completed():  # polling alone completes an average, division included
        pass
    assert torch.equal(avg, torch.full((3,), 4.0))


def test_flat_reduce_scatter_and_all_gather(fresh_dtcore):
    ctx = dtcore.init(timeout=30)
    comm = ctx.communicator
    out = torch.empty(3)
    comm.reduce_scatter(out, torch.arange(3.0), "avg").wait(10.0)
    assert torch.equal(out, torch.arange(3.0))
    gathered = torch.empty(3)
    comm.all_gather(gathered, torch.arange(3.0)).wait(10.0)
    assert torch.equal(gathered, torch.arange(3.0))
    with pytest.raises(dtcore.ConfigError, match="world size x 3"):
        comm.all_gather(torch.empty(4), torch.arange(3.0))


def test_seed_is_seed_plus_rank(fresh_dtcore):
    dtcore.init(timeout=30, seed=1234)
    a = torch.rand(3)
    torch.manual_seed(1234 + 0)
    assert torch.equal(a, torch.rand(3))


def test_main_process_first_runs_the_block(fresh_dtcore):
    dtcore.init(timeout=30)
    ran = []
    with dtcore.main_process_first():
        ran.append(True)
    assert ran == [True]
    dtcore.barrier()


def test_python_logging_reaches_the_cpp_sinks(tmp_path):
    # A separate process, so that this process's logger keeps its default sinks.
    code = (
        "import logging, dtcore;"
        f"ctx = dtcore.init(timeout=30, log_dir={str(tmp_path)!r});"
        "logging.getLogger('dtcore.user').warning('hello from python');"
        "logging.getLogger('dtcore').debug('debug only in the file');"
        "print(ctx.log_file)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    log_file = out.stdout.strip().splitlines()[-1]
    assert os.path.dirname(log_file) == str(tmp_path)
    text = pathlib.Path(log_file).read_text()
    assert "[W] [rank 0/1 " in text and "user: hello from python" in text
    assert "debug only in the file" in text
    assert "ready in" in text
    assert "user: hello from python" in out.stderr  # warnings reach the console
    assert "debug only in the file" not in out.stderr


def test_dtcore_logger_does_not_propagate_twice():
    assert logging.getLogger("dtcore").propagate is False


def test_ddp_drop_in_refuses_what_it_cannot_honour(fresh_dtcore):
    dtcore.init(timeout=30)
    net = torch.nn.Linear(3, 3)
    with pytest.raises(dtcore.ConfigError, match=r"device_ids=\[1\].*cpu"):
        dtcore.DistributedDataParallel(net, device_ids=[1])
    with pytest.raises(dtcore.ConfigError, match="dim=1"):
        dtcore.DistributedDataParallel(net, dim=1)
    with pytest.raises(dtcore.ConfigError, match="init_sync=False"):
        dtcore.DistributedDataParallel(net, init_sync=False)
    with pytest.raises(dtcore.ConfigError, match="device_mesh"):
        dtcore.DistributedDataParallel(net, device_mesh=object())
    with pytest.raises(dtcore.ConfigError, match="unknown argument 'bucket_size'"):
        dtcore.DistributedDataParallel(net, bucket_size=3)
    # torch's own defaults, passed explicitly, are accepted
    model = dtcore.DistributedDataParallel(net, None, None, 0, None, True, None, bucket_cap_mb=1,
                                           gradient_as_bucket_view=True, skip_all_reduce_unused_params=False,
                                           batched_grad_copy=False, mixed_precision=None)
    with pytest.raises(dtcore.ConfigError, match="register_comm_hook is not supported"):
        model.register_comm_hook(None, None)
    with pytest.raises(dtcore.ConfigError, match="comm_dtype=torch.int8"):
        dtcore.wrap(torch.nn.Linear(2, 2), comm_dtype=torch.int8)
    with pytest.raises(dtcore.ConfigError, match="bucket_mb=0 is not a positive size"):
        dtcore.wrap(torch.nn.Linear(2, 2), bucket_mb=0)
    model(torch.ones(1, 3)).sum().backward()  # world of one: the average is the gradient itself
    assert torch.equal(net.weight.grad, torch.ones(3, 1).expand(3, 3))


def test_create_graph_through_a_wrapped_model_is_refused_clearly(fresh_dtcore):
    dtcore.init(timeout=30)
    model = dtcore.wrap(torch.nn.Linear(3, 1))
    loss = (model(torch.ones(2, 3)) ** 2).sum()
    with pytest.raises(RuntimeError, match=r"create_graph=True\) through a wrapped model is not supported"):
        loss.backward(create_graph=True)
    model(torch.ones(2, 3)).sum().backward()  # the next step is clean
