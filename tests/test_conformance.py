"""Every registered metric keeps the one contract (tests/conformance.py): declared sub-scores ==
written, range and direction as declared, batch and order invariance, reward == Metric == job fields for
the same inputs, the named classes == the generic ones, pickling, a first call that loads a model leaves torch's random
generator as it was. Each runs on its tiny model (the tiny
models are built once per session: tests/contract_cases.py); a metric registered without a tiny case fails
here, asking for one.

This replaces the per-metric equivalence tests of the generic and named classes (test_metric_reward.py,
test_judge_rewards.py, test_tm_judges.py)."""

from __future__ import annotations

import pytest

from capreward import registry
from conformance import ConformanceCase, MetricConformance
from contract_cases import BUILTIN, Models, cases


@pytest.fixture(scope="session")
def models() -> Models:
    return Models()


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_every_registered_metric_has_a_tiny_case():
    assert set(registry.names()) == set(BUILTIN), "a registered metric has no tiny case: add it to contract_cases.py"


@pytest.mark.parametrize("name", BUILTIN)
def test_the_metric_keeps_the_contract(name, models, tmp_path_factory):
    case = cases(name, tmp_path_factory.mktemp(name))
    conformance = MetricConformance(ConformanceCase(
        name, case.captions, case.images, case.references, case.inputs, models.scorer_option(name),
        ordered=name not in ("visce2", "gveval")))  # the tiny VLM judge reads the image's colour only
    assert conformance.check_all() == ["declared sub-scores", "range and direction", "batch and order",
                                       "reward, Metric and job", "named and generic", "pickling", "random streams"]
