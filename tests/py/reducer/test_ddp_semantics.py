"""dtcore.DistributedDataParallel behaves as torch DDP where a difference would be silent: unused
parameters, reassigned buffers, static graphs, ignored parameters, process groups, the error
phrases, the compatibility surface, wrapping a module again, torch's logging data and its
profiler's events. One 2-rank job (workers/ddp_semantics_worker.py) runs them all."""

import pytest

from launch_helpers import run_job


@pytest.fixture(scope="module")
def ranks():
    reports = run_job("ddp_semantics_worker.py", 2, timeout=180)
    for report in reports:
        for case, result in report.items():
            assert not (isinstance(result, dict) and "raised" in result), (case, result["raised"])
    return reports


pytestmark = pytest.mark.multirank


def test_a_parameter_unused_on_every_rank_keeps_grad_none(ranks):
    for r in ranks:
        j = r["unused_everywhere"]
        assert j["none_before"]  # as torch DDP: no .grad until a backward gives one
        assert j["none_after"] == {"used.weight": False, "used.bias": False, "spare.weight": True, "spare.bias": True}
    # used by rank 1 only: both ranks hold the average (rank 0 contributes zeros)
    spare = [r["unused_everywhere"]["spare_grad"] for r in ranks]
    assert spare[0] == spare[1] and spare[0] != 0.0


def test_functional_call_leaves_the_modules_own_parameters_without_grad(ranks):
    for r in ranks:
        j = r["functional_call"]
        assert j["module_grads_none"] == [True, True]
        assert j["passed_grads"] == [1.0, 1.0]


def test_a_reassigned_buffer_is_still_broadcast(ranks):
    for r in ranks:
        assert r["reassigned_buffer"] == {"values": [1.0, 2.0], "is_buffer": True}  # rank 0's each time


def test_a_model_with_nothing_to_train_is_refused_with_torchs_phrase(ranks):
    for r in ranks:
        e = r["nothing_to_train"]["error"]
        assert e.startswith(
            "ConfigError: DistributedDataParallel is not needed when a module doesn't have any parameter that "
            "requires a gradient"
        ), e
        assert "Linear has none" in e and "Fix: " in e


def test_static_graph_lets_the_same_parameters_go_unused(ranks):
    for r in ranks:
        for how in ("argument", "method"):
            assert r["static_graph"][how] == {"static_graph": True, "spare_none": True, "used_grad": [9.0, 9.0]}


def test_ignored_parameters_and_buffers_are_neither_compared_broadcast_nor_reduced(ranks):
    for rank, r in enumerate(ranks):
        j = r["ignored_parameters"]
        assert j["same_fc1"] and j["fc1_grad_same"]
        assert j["fc2_grad_shape"] == [1 + rank, 1]  # this rank's own parameter, with its own gradient
        assert j["local_buffer"] == [float(rank)]
        assert j["ignored"] == ["fc2.local", "fc2.weight"]


def test_an_unfinished_reduction_is_reported_with_torchs_phrases(ranks):
    for rank, r in enumerate(ranks):
        e = r["unfinished_reduction"]["error"]
        assert "Expected to have finished reduction in the prior iteration" in e, e
        assert "passing the keyword argument `find_unused_parameters=True`" in e
        assert "`forward` function outputs participate in calculating loss" in e
        assert f"Parameter indices which did not receive grad for rank {rank}: 2 3" in e
        assert f"Parameters which did not receive grad for rank {rank}: spare.weight, spare.bias" in e


def test_whole_job_groups_a_1d_mesh_and_a_subgroup_are_accepted_a_non_member_refused(ranks):
    for r in ranks:
        j = r["groups"]
        assert j["whole"] and j["mesh"] and j["default"]
    first, second = (r["groups"] for r in ranks)
    assert first["refused"] is None and first["single"] == {"group": True, "grad": [1.0] * 4}  # its own only
    assert second["single"] is None
    assert "rank 1 is not in that group" in second["refused"], second["refused"]  # more in test_subgroups.py


def test_compatibility_surface(ranks):
    for rank, r in enumerate(ranks):
        j = r["compatibility"]
        assert j["quiet"] == []  # forward_sync_buffers alone: no warning, as torch
        assert len(j["warned"]) == 1 and j["warned"][0].startswith(
            "FutureWarning: `broadcast_buffers` is deprecated. Use `forward_sync_buffers` instead."
        ), j["warned"]
        assert j["forward_sync_buffers"] == [False, False, False]
        assert j["rank_local_buffer"] == float(rank)  # broadcast_buffers=False: not broadcast at init either
        assert j["bucket_bytes_cap_list"] == [[2**20, 2 * 2**20], []]  # as torch's: empty when not given
        assert "bucket_cap_mb_list=[1, 2, 3]" in j["uneven_list"] and "Fix: pass [first, rest]" in j["uneven_list"]
        assert j["copy"] == {"process_group": True, "averaged": True, "grad": [1.5, 1.5]}


def test_a_module_wrapped_again_is_taken_over_by_the_new_wrapper_and_the_old_refuses(ranks):
    for r in ranks:
        j = r["rewrapped"]
        assert j["grads"] == [36.0, 36.0, 36.0]  # 8 elements x 3 rows x the ranks' mean input (1.5)
        for refused in j["refused"]:
            assert refused.startswith("this DistributedDataParallel of TwoLayers was replaced by a newer "), refused
            assert "refuses forward and backward" in refused


def test_torch_logging_data_reports_real_values(ranks):
    for rank, r in enumerate(ranks):
        j = r["logging_data"]
        built = j["at_construction"]
        assert built["iteration"] == 0 and built["module_name"] == "TwoLayers"
        assert (built["rank"], built["world_size"], built["backend_name"]) == (rank, 2, "gloo")
        assert (built["num_parameter_tensors"], built["total_parameter_size_bytes"]) == (4, 80)
        assert built["dtypes"] == "float" and built["bucket_sizes"] == "80"
        assert built["bucket_cap_bytes"] == 25 * 2**20 and built["find_unused_parameters"] == 0
        assert built["gradient_as_bucket_view"] == 0 and built["broadcast_buffers"] == 1  # the arguments given
        assert built["device_ids"] == "" and built["output_device"] == -1 and built["has_sync_bn"] == 0
        assert "comm_hook" not in built and "forward_compute_time" not in built
        assert built["gloo_num_threads"] == 2  # torch's ProcessGroupGloo default, which dtcore's Gloo runs on
        # Sampled as torch: the first 10 iterations, then one in 2 (the rate set), at the next forward.
        assert j["iterations"] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10, 12]
        after = j["after"]
        assert after["has_rebuilt_buckets"] == 1 and after["rebuilt_bucket_sizes"] == "80"
        assert sorted(after["prev_iteration_grad_ready_order_indices"].split(", ")) == ["0", "1", "2", "3"]
        assert sorted(after["rebuilt_per_bucket_param_indices"].split()) == ["0", "1", "2", "3"]
        for name in ("forward_compute_time", "backward_compute_time", "backward_comm_time"):
            assert after[name] >= 1 and after[f"avg_{name}"] >= 1, (name, after)
        overlap = after["backward_compute_comm_overlap_time"]
        assert overlap <= after["backward_compute_time"] and overlap <= after["backward_comm_time"]
        assert (
            after["forward_compute_time_start"]
            <= after["backward_compute_time_start"]
            <= after["backward_comm_time_start"]
            <= after["backward_compute_time_end"]
            <= after["backward_comm_time_end"]
        )
        hooked, builtin, builtin_name = j["hooks"]
        assert hooked == "allreduce_hook" and builtin == builtin_name
        assert "Expected to have finished reduction in the prior iteration" in j["error"]
        assert j["error_logged"] == "ConfigError: " + j["error"]


def test_collectives_and_the_unused_search_are_events_of_torchs_profiler(ranks):
    for r in ranks:
        assert r["profiled"] == {
            "all_reduce": 12,  # 3 steps of 4 buckets, nothing else
            "async": [True],  # ended on the communicator's thread
            "other_collectives": [],
            "search": ["dtcore.reducer::search_unused_parameters"],
        }
