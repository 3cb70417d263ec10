"""Graphs that vary, as torch DDP handles them: outputs the loss does not use, gradients autograd leaves
undefined, static graphs that change, ranks whose graphs differ, and buckets skipped as unused. One
2-rank job (workers/graphs_worker.py) runs dtcore beside torch DDP on the same models."""

import pytest

from launch_helpers import run_job

pytestmark = pytest.mark.multirank

STATIC_USED_LATER = (
    "Your training graph has changed in this iteration, e.g., one parameter is unused in first iteration, but then "
    "got used in the second iteration. this is not compatible with static_graph set to True."
)
STATIC_UNUSED_LATER = (  # torch's words, the line break included (its own test matches them)
    "Expected to have finished reduction in the prior iteration before starting a new one. This error indicates "
    "that your training graph has changed in this iteration, e.g., one parameter is used in first iteration, but "
    "then got unused in the second iteration. this is not compatible with static_graph set to True.\nParameter "
    "indices which did not receive grad for"
)


@pytest.fixture(scope="module")
def ranks():
    reports = run_job("graphs_worker.py", 2, timeout=240)
    for report in reports:
        for case, result in report.items():
            assert not (isinstance(result, dict) and "raised" in result), (case, result["raised"])
    return reports


def test_outputs_the_loss_does_not_use_leave_their_parameters_none_as_torch_ddp(ranks):
    for r in ranks:
        for kind, j in r["unused_outputs"].items():
            grads = j["grads"]
            assert grads == {
                "trunk.weight": "equal",
                "trunk.bias": "equal",
                "used.weight": "equal",
                "used.bias": "equal",
                "aux.weight": "none",
                "aux.bias": "none",
            }, (kind, grads)
        kept = {kind: j["kept"] for kind, j in r["unused_outputs"].items()}
        # The outputs come back as the module made them (type, and what is not a tensor).
        assert kept == {
            "DictHeads": {"type": "dict", "extra": 3},
            "TupleHeads": {"type": "tuple", "extra": None},
            "DataclassHeads": {"type": "Output", "extra": None},
        }


def test_without_find_unused_parameters_an_unused_output_is_reported_as_torch_ddp_does(ranks):
    for rank, r in enumerate(ranks):
        for kind, j in r["unused_outputs"].items():
            mine, theirs = j["without_find_unused"]
            for message in (mine, theirs):
                assert message.startswith("Expected to have finished reduction in the prior iteration"), (kind, message)
                assert f"Parameter indices which did not receive grad for rank {rank}: 4 5" in message
            assert f"Parameters which did not receive grad for rank {rank}: aux.weight, aux.bias" in mine
            assert "passing the keyword argument `find_unused_parameters=True`" in mine


def test_a_hugging_face_model_whose_head_the_loss_ignores_trains_as_under_torch_ddp_at_every_stage(ranks):
    for r in ranks:
        j = r["hf_unused_head"]
        head = set(j["zero0"]["head"])
        assert head == {"multiple_choice_head.summary.weight", "multiple_choice_head.summary.bias"}
        assert {n for n, g in j["zero0_grads"].items() if g == "none"} == head
        assert all(g == "equal" for n, g in j["zero0_grads"].items() if n not in head), j["zero0_grads"]
        for zero in (0, 1, 2):
            stage = j[f"zero{zero}"]
            assert stage["output"] == "GPT2DoubleHeadsModelOutput"
            for name, p in stage["params"].items():
                assert p["equal_to_torch"], (zero, name)
                # AdamW's weight decay would move a parameter whose .grad were zeros: the head stays put.
                assert p["changed"] == (name not in head), (zero, name)


def test_undefined_gradients_stay_none_as_without_a_wrapper(ranks):
    for r in ranks:
        for how, j in r["undefined_grads"].items():
            assert j["dtcore"] == j["local"] == [True, True], (how, j)


def test_a_static_graph_that_changes_is_an_error_naming_the_parameter_with_torchs_words(ranks):
    for rank, r in enumerate(ranks):
        j = r["static_graph_changes"]
        assert j["now_used"].startswith(STATIC_USED_LATER), j["now_used"]
        assert f"Parameter 'lin2.weight' (index 1) got a gradient on rank {rank}" in j["now_used"]
        assert "Fix: " in j["now_used"]
        assert j["logged"] == "ConfigError: " + j["now_used"]  # torch's logging data records it
        # The backward that raised is reported by the next forward, then training goes on.
        assert j["next_forward"].startswith(STATIC_UNUSED_LATER), j["next_forward"]
        assert j["trains_after"]
        assert j["now_unused"].startswith(STATIC_UNUSED_LATER), j["now_unused"]
        assert f"Parameters which did not receive grad for rank {rank}: lin2.weight." in j["now_unused"]


def test_ranks_with_different_graphs_average_as_torch_ddp_and_rebuild_only_a_static_one(ranks):
    for r in ranks:
        j = r["different_graphs"]
        for option in ("find_unused_parameters", "static_graph"):
            assert j[option]["grads"] == {"lin1.weight": "equal", "lin2.weight": "equal"}, (option, j)
        assert j["find_unused_parameters"]["rebuilt"] == [0, 0]  # (dtcore, torch): has_rebuilt_buckets
        assert j["static_graph"]["rebuilt"] == [1, 1]


def test_a_bucket_no_rank_used_is_skipped_and_reduced_late_when_one_rank_uses_it_after_all(ranks):
    for r in ranks:
        j = r["skipped_buckets"]
        assert j["buckets"] == 2
        # (skip, plain) per step: the first step reduces all; step 3, where rank 1 uses fc2, catches up.
        assert j["reduced"] == [[2, 2], [1, 2], [1, 2], [2, 2], [2, 2]], j["reduced"]
        for step, pair in enumerate(j["grads"]):
            for grads in pair:
                assert grads == {"fc1.weight": "equal", "fc2.weight": "equal" if step == 3 else "none"}, (step, pair)
        assert j["logged"] == 1  # torch's num_buckets_reduced
        assert "skip_all_reduce_unused_params=True without find_unused_parameters=True" in j["refused"]
        assert "Fix: " in j["refused"]


def test_an_output_may_be_changed_in_place_before_the_loss(ranks):
    for r in ranks:
        assert r["in_place_outputs"]["grad"] == [4.0] * 4  # doubled in place, averaged over ranks
