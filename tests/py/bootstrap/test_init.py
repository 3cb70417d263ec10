"""dtcore.init() in one process (a world of one): lifecycle, arguments, settings, seeding, logging."""

import copy
import inspect
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


def test_repeated_init_refuses_other_settings_instead_of_ignoring_them(fresh_dtcore, tmp_path):
    ctx = dtcore.init(timeout=30, seed=7)
    for kwargs, have in [
        ({"timeout": 60}, "timeout=30 (init(timeout=))"),
        ({"seed": 8}, "seed=7"),
        ({"log_dir": str(tmp_path)}, "log_dir=''"),
        ({"torch_distributed": False}, "torch.distributed set up"),
    ]:
        with pytest.raises(dtcore.ConfigError, match="already initialized with") as e:
            dtcore.init(**kwargs)
        assert have in str(e.value) and "dtcore.shutdown() first" in str(e.value), str(e.value)
    # What was asked the first time, or nothing, returns the same context.
    assert dtcore.init(timeout=30, seed=7, backend="GLOO") is ctx
    assert dtcore.init() is ctx
    with pytest.raises(dtcore.ConfigError, match=r"init\(rank='0'\) must be an integer"):
        dtcore.init(rank="0")


def test_the_context_is_the_joined_world_and_read_only(fresh_dtcore):
    ctx = dtcore.init(timeout=30)
    assert isinstance(ctx, dtcore._C.WorldSpec)
    assert tuple(ctx.FIELDS) == (
        "rank",
        "world_size",
        "local_rank",
        "local_world_size",
        "node_rank",
        "num_nodes",
        "master_addr",
        "master_port",
    )
    assert ctx.sources["master_port"].startswith("chosen: a free port")  # the port really used, and why
    assert ctx.sources["rank"].startswith("default")
    with pytest.raises(AttributeError, match="read-only"):
        ctx.backend = "nccl"
    with pytest.raises(AttributeError):
        ctx.rank = 3
    # Copies are the context itself (read-only, one communicator); equal contexts describe one world.
    assert copy.copy(ctx) is ctx and copy.deepcopy(ctx) is ctx
    assert ctx == ctx and hash(ctx) == hash(ctx) and ctx != "ctx"
    assert list(inspect.signature(dtcore.wrap).parameters)[0] == "model"


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


def test_init_joins_a_default_group_the_script_set_up_and_leaves_it(fresh_dtcore):
    """A world of one on torch's HashStore (which cannot be cloned): dtcore runs on that store."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ctx = dtcore.init(timeout=30)
        assert not ctx.owns_torch_process_group
        assert torch.equal(dtcore.all_reduce(torch.arange(3.0)), torch.arange(3.0))
        dtcore.shutdown()
        assert dist.is_initialized()  # the script's group outlives dtcore
        dtcore.init(timeout=30)  # and carries a second join
    finally:
        dtcore.shutdown(barrier=False)
        dist.destroy_process_group()


def test_a_default_group_of_another_shape_is_refused_naming_both(fresh_dtcore):
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(
            dtcore.ConfigError,
            match=r"already initialized as rank 0 of 1, but dtcore sees rank 1 of 2 "
            r"\(init\(rank=\), init\(world_size=\)\)\. Fix: call dtcore.init\(\) instead",
        ):
            dtcore.init(rank=1, world_size=2, timeout=5)
        # Told to leave torch.distributed alone, dtcore keeps to a store of its own.
        dtcore.init(timeout=30, torch_distributed=False, master_port=0)
        assert dtcore.get_context().rendezvous.store is not None
    finally:
        dtcore.shutdown(barrier=False)
        dist.destroy_process_group()


def test_arguments_complete_a_world_the_environment_left_half_done(fresh_dtcore, monkeypatch):
    """WORLD_SIZE without RANK (a job file that exports one of them): init(rank=, world_size=) wins."""
    monkeypatch.setenv("WORLD_SIZE", "4")
    ctx = dtcore.init(rank=0, world_size=1, timeout=30)
    assert (ctx.rank, ctx.world_size) == (0, 1)
    assert ctx.sources["rank"] == "init(rank=)"
    dtcore.shutdown()
    with pytest.raises(dtcore.ConfigError, match=r"RANK is not set.*or pass init\(rank=\)"):
        dtcore.init(timeout=30)


def test_bad_arguments_name_value_and_fix(fresh_dtcore):
    with pytest.raises(dtcore.ConfigError, match=r"init\(backend='mpi'\) is not a backend.*Fix"):
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


def test_seed_is_seed_plus_rank(fresh_dtcore):
    dtcore.init(timeout=30, seed=1234)
    a = torch.rand(3)
    torch.manual_seed(1234 + 0)
    assert torch.equal(a, torch.rand(3))


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
