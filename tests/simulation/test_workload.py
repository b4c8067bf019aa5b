"""The workload's plans (simulation.workload): the mix, shared and inline payloads, late and duplicated events."""

from collections import Counter

import pytest

from simulation.workload import DEFAULT_MIX, LIVE_ONLY, SCENARIOS, Workload, is_purged


def test_plans_follow_the_mix_and_the_seed():
    plans = list(Workload(seed=3).plans("r", 20_000))
    assert plans == list(Workload(seed=3).plans("r", 20_000))
    counts = Counter(p.scenario for p in plans)
    for scenario, share in DEFAULT_MIX.items():
        assert counts[scenario] / len(plans) == pytest.approx(share, abs=0.015)
    assert set(DEFAULT_MIX) == set(SCENARIOS)
    assert is_purged("deleted") and not is_purged("counter revived")


def test_a_shared_payload_is_the_stored_payload_of_the_message_before():
    plans = list(Workload(shared_share=0.3, inline_share=0.2).plans("r", 5_000))
    for before, plan in zip(plans, plans[1:]):
        if plan.shared:
            assert before.stored and plan.payload == before.payload and plan.stored
        else:
            assert plan.payload == f"r-p{plans.index(plan):08d}"
    shared = sum(p.shared for p in plans) / len(plans)
    inline = sum(not p.stored for p in plans) / len(plans)
    assert 0.15 < shared < 0.3 and 0.1 < inline < 0.2


def test_late_and_duplicated_shares():
    plans = list(Workload(mix=LIVE_ONLY, late_share=0.05, duplicate_share=0.1).plans("r", 20_000))
    assert {p.scenario for p in plans} == {"live"}
    assert sum(p.late for p in plans) / len(plans) == pytest.approx(0.05, abs=0.01)
    assert sum(p.duplicated for p in plans) / len(plans) == pytest.approx(0.1, abs=0.01)
    assert len({p.message for p in plans}) == len(plans)
