"""dtcore.wrap under torch.compile (Note [dtcore under torch.compile]): the three ways to compile a
wrapped model give torch DDP's compiled gradients, no graph break in dtcore's code, no graph compiled
after the first step, and communication that starts while the compiled backward still runs. One
2-rank job (workers/compile_worker.py) runs dtcore beside torch DDP compiled the same way."""

import pytest

from launch_helpers import run_job

pytestmark = pytest.mark.multirank

DDP_SPLIT = "DDPOptimizer intentional graph-break"


@pytest.fixture(scope="module")
def ranks():
    reports = run_job("compile_worker.py", 2, timeout=300)
    for report in reports:
        for case, result in report.items():
            assert not (isinstance(result, dict) and "raised" in result), (case, result["raised"])
    return reports


@pytest.mark.parametrize("form", ["outer", "inner", "method"])
def test_each_form_trains_as_torch_ddp_compiled(ranks, form):
    for r in ranks:
        j = r["forms"][form]
        assert j["grad_diff"] == 0.0 and j["param_diff"] == 0.0, j  # Gloo sums two ranks alike: bitwise
        assert j["dtcore_breaks"] == []
        assert j["buckets"] >= 3


@pytest.mark.parametrize("form", ["outer", "inner", "method"])
def test_no_graph_is_compiled_after_the_first_step(ranks, form):
    for r in ranks:
        graphs = r["forms"][form]["graphs"]
        assert graphs[0] >= 1 and graphs == [graphs[0]] * len(graphs), graphs  # no_sync in step 3 included


@pytest.mark.parametrize("form", ["outer", "inner", "method"])
def test_the_first_bucket_goes_while_the_compiled_backward_runs(ranks, form):
    for r in ranks:
        # With the graph split into bucket-sized pieces the first bucket starts after the last piece's
        # backward; without it (the control), only once every gradient exists.
        assert r["forms"][form]["first_collective"] < 0.6, r["forms"]
        assert r["forms"]["unsplit_first_collective"] > 0.7, r["forms"]


def test_explain_finds_no_graph_break_but_the_bucket_split(ranks):
    for r in ranks:
        for zero, j in r["explain"].items():
            assert j["breaks"] >= 2 and j["graphs"] == j["breaks"] + 1, (zero, j)
            assert all(reason.startswith(DDP_SPLIT) for reason in j["reasons"]), (zero, j["reasons"])


def test_sharded_stages_compile_and_match_zero0(ranks):
    for r in ranks:
        for zero, j in r["sharded"].items():
            assert j["param_diff"] < 1e-6, (zero, j)
            assert j["dtcore_breaks"] == []
            assert j["graphs"][0] >= 1 and len(set(j["graphs"])) == 1, (zero, j)


def test_find_unused_parameters_compiled_as_torch_ddp(ranks):
    for r in ranks:
        j = r["find_unused"]
        assert j["grad_diff"] == 0.0 and j["unused_grads"] == [True, True], j
        assert j["dtcore_breaks"] == [] and len(set(j["graphs"])) == 1, j


def test_buckets_below_dynamos_first_piece_compile(ranks):
    for r in ranks:
        j = r["small_buckets"]
        assert j["grad_diff"] == 0.0 and j["buckets"] > 4 and j["first_collective"] < 0.6, j


def test_auto_buckets_compiled(ranks):
    for r in ranks:
        assert r["auto_buckets"] == {"param_diff": 0.0, "chosen": True}


def test_models_with_quirks_compile_as_torch_ddp(ranks):
    for r in ranks:  # tied weights, a parameter used twice, frozen ones, BatchNorm buffers
        j = r["quirks"]
        assert j["buffers_equal"] and j["dtcore_breaks"] == [], j
