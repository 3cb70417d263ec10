"""The Python face of launcher detection: the same C++ reader, driven with explicit environments."""

import pytest

import dtcore
from dtcore import _C


def test_sources_name_where_each_value_came_from():
    spec = _C.read_world(
        {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "gpu[07-08]", "MASTER_PORT": "29999"},
        {"local_rank": 0, "local_world_size": 1},
    )
    assert (spec.launcher, spec.rank, spec.world_size, spec.master_addr, spec.master_port) == (
        "slurm",
        3,
        4,
        "gpu07",
        29999,
    )
    assert spec.sources["rank"] == "SLURM_PROCID"
    assert spec.sources["local_rank"] == "init(local_rank=)"
    assert spec.sources["master_addr"] == "first host of SLURM_JOB_NODELIST"


def test_unknown_and_badly_typed_arguments_are_config_errors():
    with pytest.raises(dtcore.ConfigError, match="unknown argument 'rnak'"):
        _C.read_world({}, {"rnak": 1})
    with pytest.raises(dtcore.ConfigError, match=r"init\(rank='1'\) must be an integer"):
        _C.read_world({}, {"rank": "1"})
    with pytest.raises(dtcore.ConfigError, match=r"init\(rank=True\) must be an integer"):
        _C.read_world({}, {"rank": True})


def test_error_classes_form_one_hierarchy():
    for cls in (dtcore.ConfigError, dtcore.RendezvousError, dtcore.CommError, dtcore.CheckpointError):
        assert issubclass(cls, dtcore.DtcoreError)
    assert issubclass(dtcore.DtcoreError, RuntimeError)
    with pytest.raises(dtcore.DtcoreError):
        _C.read_world({"RANK": "x", "WORLD_SIZE": "2"})


def test_check_world_returns_items_for_the_checker():
    spec = _C.read_world(
        {
            "RANK": "0",
            "WORLD_SIZE": "16",
            "LOCAL_RANK": "9",
            "LOCAL_WORLD_SIZE": "16",
            "TORCHELASTIC_RUN_ID": "r",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "1",
        }
    )
    problems = _C.check_world(spec, "nccl", visible_gpus=8, host="h")
    assert [p.variable for p in problems] == ["LOCAL_RANK"]
    assert "invalid device ordinal" in problems[0].message
    assert "--nproc_per_node=8" in problems[0].fix


def test_ranks_share_a_gpu_only_with_nccl_2_30_and_the_variable_set(log_messages):
    from dtcore.bootstrap.join import nccl_shares_gpus

    on = {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}
    assert nccl_shares_gpus("2.30.7", on)
    assert nccl_shares_gpus("3.0.1", on)
    assert not nccl_shares_gpus("2.30.7", {})
    assert not nccl_shares_gpus("2.30.7", {"NCCL_MULTI_RANK_GPU_ENABLE": "0"})
    messages = log_messages("dtcore")
    assert not nccl_shares_gpus("2.28.9", on)
    assert not nccl_shares_gpus("", on)  # a dtcore built without NCCL
    assert len(messages) == 2, messages
    assert "this NCCL (2.28.9) is older than 2.30" in messages[0]
    assert "refused" in messages[0] and "Fix:" in messages[0]
    assert "(not built in)" in messages[1]
