"""specdec.planning.planner: what every sequence's policy shares. Cost fits per load level, an
operator's load cap, and the draft model's health: a failed draft is off for every sequence,
then probed by one at a time with a doubling backoff."""
import pytest

from specdec.planning.planner import Planner
from specdec.planning.policy import Choice
from specdec.records import Round

DRAFT_CALL, DRAFT_TOKEN, VERIFY_CALL, VERIFY_TOKEN, OTHER = 0.002, 0.0006, 0.005, 0.0003, 0.0005


def test_load_levels_have_their_own_costs():
    planner = Planner(8)
    for active in (1, 16):
        planner.active = active
        verify = VERIFY_CALL * (1 if active == 1 else 8)
        for k in (0, 2, 4, 8, 4, 2):
            draft = DRAFT_CALL + DRAFT_TOKEN * k if k else 0.0
            planner.observe(Round(k, k // 2, draft, verify + VERIFY_TOKEN * k, OTHER, False, 1),
                            planner.open(8, auto=False))
            planner.active -= 1
    planner.active = 1
    one = planner.estimates().costs["verify_call"]
    planner.active = 16
    assert planner.estimates().costs["verify_call"] == pytest.approx(8 * one, rel=0.1)


def test_operator_load_cap_lowers_k_then_turns_speculation_off():
    planner = Planner(8, load_cap=(4, 12))
    auto, fixed, seeded = (planner.open(8, auto=True), planner.open(8, auto=False),
                           planner.open(8, auto=False, frozen=True))
    ks = []
    for active in range(16):
        planner.active = active
        ks.append(fixed.choose(8).k)
        assert seeded.choose(8).k == 8       # a seeded sampling request keeps its k
    assert ks[:4] == [8] * 4 and ks[12:] == [0] * 4
    assert all(a >= b for a, b in zip(ks, ks[1:])) and 0 < ks[6] < 8
    assert auto.choose(8) == fixed.choose(8) == Choice(0, "load_cap")


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def failed(policy, reason="error"):
    policy.observe(Round(0, 0, 0.01, 0.005, None, False, 1, reason, 4, ""))


def passed(policy, k):
    policy.observe(Round(k, 1, 0.002, 0.005, None, False, 1, None, 4, ""))


def test_a_failing_draft_is_off_for_everyone_then_probed_by_one_sequence():
    clock = Clock()
    planner = Planner(8, down_s=0.5, clock=clock)
    a, b, c = (planner.open(4, auto=False) for _ in range(3))
    assert a.choose(4).k == 4
    failed(a)
    failed(b)                               # in flight when the draft went down: no extra wait
    assert a.choose(4) == b.choose(4) == Choice(0, "draft_down")
    clock.t += 0.6
    assert b.choose(4).k == 4               # b probes
    assert a.choose(4) == c.choose(4) == Choice(0, "draft_down")
    failed(b)                               # the probe failed: down again, for twice as long
    clock.t += 0.6
    assert a.choose(4).k == 0
    clock.t += 0.5
    assert a.choose(4).k == 4
    passed(a, 4)                            # back: everyone drafts
    assert b.choose(4).k == 4 and c.choose(4).k == 4


def test_a_probe_that_never_returns_frees_the_probe():
    clock = Clock()
    planner = Planner(8, down_s=0.5, clock=clock)
    a, b = planner.open(4, auto=False), planner.open(4, auto=False)
    failed(a)
    clock.t += 1
    assert a.choose(4).k == 4 and b.choose(4).k == 0
    planner.close(a)                         # a ended (cancelled) before its round finished
    assert b.choose(4).k == 4
