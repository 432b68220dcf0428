"""experiments/dense_claims.py: the world's ground truth by hand, and a short real run (SFT, TRL GRPO
with the dense configuration and the control arm, held-out evaluation, best-of-n) whose trajectory holds
both logged parts of the claim reward.

Direction is not asserted here: in the full run (docs/claims.md, 5 seeds x 160 steps) the dense arm is not
separated from the wrong-image control (both fall into an image-blind run-on colour list on some seeds),
so the direction of the GRPO arms is reported there, not pinned."""

from __future__ import annotations

import math

import pytest

from conftest import REPO, import_script
from fixtures_llava import one_torch_thread  # noqa: F401


@pytest.fixture(scope="module")
def experiment():
    return import_script(REPO / "experiments" / "dense_claims.py", "dense_claims_under_test")


def test_ground_truth_by_hand(experiment):
    truth = experiment.ground_truth
    # two claims, the background right, the patch hallucinated (blue is not in a red/green image)
    assert truth("the background is red. there is a blue patch.", "red", "green") == {
        "true_precision": 0.5, "bound_precision": 0.5, "true_coverage": 0.5, "claims": 2.0}
    # both colours present but swapped: presence precision 1, bound precision 0, full coverage
    assert truth("the background is green. there is a red patch.", "red", "green") == {
        "true_precision": 1.0, "bound_precision": 0.0, "true_coverage": 1.0, "claims": 2.0}
    # a run-on sentence is one claim (the rule-based splitter cuts at sentence ends and clauses)
    assert truth("the background is red there is a red patch.", "green", "blue") == {
        "true_precision": 0.0, "bound_precision": 0.0, "true_coverage": 0.0, "claims": 1.0}
    # a claim naming no colour is unsupported; an empty caption has no claim
    assert truth("there is a patch.", "red", "green")["true_precision"] == 0.0
    assert truth("", "red", "green")["claims"] == 0.0


def test_sft_captions_hallucinate_only_absent_colours(experiment):
    import random

    rng = random.Random(0)
    for _ in range(200):
        caption = experiment.sft_caption("red", "green", rng, right=0.0)
        g = experiment.ground_truth(caption, "red", "green")
        assert g["true_precision"] == 0.0 and g["true_coverage"] == 0.0, caption
        caption = experiment.sft_caption("red", "green", rng, right=1.0)
        assert experiment.ground_truth(caption, "red", "green")["bound_precision"] == 1.0, caption


def test_separation_is_the_mean_difference_in_sd_units(experiment):
    def run(dense, control):
        return {"arms": {"dense": {"after": {"true_precision": dense}}, "control": {"after": {"true_precision": control}}}}

    out = experiment.separation([run(0.5, 0.1), run(0.7, 0.1), run(0.6, 0.4)], keys=("true_precision",))
    sep = out["true_precision"]
    assert sep["difference"] == pytest.approx(0.4)
    assert sep["sd_paired"] == pytest.approx(0.2)  # differences 0.4, 0.6, 0.2
    assert sep["z_paired"] == pytest.approx(2.0)
    assert sep["sd_pooled"] == pytest.approx(math.sqrt((0.01 + 0.03) / 2))  # variances 0.01 and 0.03
    assert sep["z_pooled"] == pytest.approx(0.4 / math.sqrt(0.02))
    one = experiment.separation([run(0.5, 0.1)], keys=("true_precision",))["true_precision"]
    assert math.isnan(one["z_paired"]) and math.isnan(one["z_pooled"])


@pytest.mark.integration
@pytest.mark.slow  # SFT then GRPO: run once in the suite, not at both ends of the version matrix (TRL's
# GRPO with the claim rewards is there already: test_claims_entry_points.py)
def test_a_short_run_logs_both_parts_of_the_claim_reward(experiment, tmp_path):
    out = experiment.main(
        ["--seeds", "0", "--steps", "2", "--sft-steps", "4", "--batch-size", "8", "--num-generations", "4",
         "--train-images", "4", "--eval-images", "2", "--eval-samples", "2", "--best-of", "2",
         "--out", str(tmp_path), "--json", str(tmp_path / "r.json")])
    (run,) = out["runs"]
    assert set(run["arms"]) == {"dense", "control"}
    for arm, result in run["arms"].items():
        assert result["aggregation"] == "normalize_then_sum", arm
        rows = result["trajectory"]
        assert [r["step"] for r in rows] == [1, 2], arm
        for row in rows:
            for key in ("claims_precision", "claims_recall", "length", "claims_precision/precision",
                        "claims_recall/recall"):
                assert math.isfinite(row[key]), (arm, key, row)
            # the reward TRL optimises is the logged part, unscored captions floored at 0
            assert row["claims_precision"] <= row["claims_precision/precision"] + 1e-6, (arm, row)
            assert row["claims_recall"] <= row["claims_recall/recall"] + 1e-6, (arm, row)
        for key in experiment.METRICS:
            assert key in result["after"], key
    for which in ("before (SFT)", "after dense", "after control", "best-of-n: random", "best-of-n: best"):
        assert which in out["summary"], which
    assert (tmp_path / "r.json").exists()
