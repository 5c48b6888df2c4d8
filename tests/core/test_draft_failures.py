"""The draft is an accelerator, never a dependency: a failing draft call costs speed, not output."""
import asyncio

import pytest

from specdec.decoding.local import LocalDrafter, LocalVerifier
from specdec.decoding.loop import speculate
from specdec.planning.planner import Planner
from specdec.records import Request
from specdec.runtime.sampling import SamplingParams
from tests.core.conftest import engines, generate
from tests.core.test_speculative_exact import MAX_TOKENS, prompts


class Unavailable(RuntimeError):
    unavailable = True


class Flaky(LocalDrafter):
    """The real draft engine, failing on chosen calls: raise, hang, or report unavailable."""

    def __init__(self, engine, faults: dict[int, str]):
        super().__init__(engine)
        self.faults, self.calls = faults, []

    async def propose(self, call):
        n = len(self.calls)
        self.calls.append(call)
        fault = self.faults.get(n)
        if fault == "error":
            raise RuntimeError("draft_model: injected")
        if fault == "unavailable":
            raise Unavailable("draft_model: stub process is not healthy")
        if fault == "timeout":
            await asyncio.sleep(3600)
        return await super().propose(call)


def run(pair, reqs, faults, timeout=None, planner=None):
    target, draft = engines(pair)
    drafter = Flaky(draft, faults)
    rounds = []
    results = generate(target, draft, reqs, planner=planner, drafter=drafter,
                       on_round=rounds.append, draft_timeout_s=timeout)
    assert target.pool.active == 0
    return results, drafter, rounds


@pytest.mark.parametrize("fault", ["error", "unavailable", "timeout"])
def test_failed_draft_calls_leave_greedy_output_exact(pair_dir, fault):
    reqs = [Request(p, MAX_TOKENS, 4) for p in prompts(4)]
    reference = [r[0] for r in generate(*engines(pair_dir), [Request(p, MAX_TOKENS, 0)
                                                            for p in prompts(4)])]
    faults = {i: fault for i in (0, 3, 4, 9)}
    results, drafter, rounds = run(pair_dir, reqs, faults, timeout=0.2)
    assert [r[0] for r in results] == reference
    assert [r.failure for r in rounds].count(fault) == 4
    assert all(r.k == 0 for r in rounds if r.failure)
    # After its failure a sequence re-prefills the draft: its next call starts at 0.
    for i in (0, 3, 4, 9):
        seq = drafter.calls[i].seq_id
        later = [c for c in drafter.calls[i + 1:] if c.seq_id == seq]
        assert not later or later[0].start == 0


def test_failed_draft_calls_leave_the_sampling_exact_per_seed(pair_dir):
    """A seeded request's tokens are its seed's: a failed draft call changes the rounds but, at
    the positions it touched, the target's own draws decide, as in a k = 0 round."""
    req = Request(prompts(1)[0], MAX_TOKENS, 3, SamplingParams(0.9, seed=17))
    target_only = generate(*engines(pair_dir), [Request(req.prompt, MAX_TOKENS, 0, req.sampling)])
    results, _, rounds = run(pair_dir, [req], {i: "error" for i in range(100)})
    assert results[0][0] == target_only[0][0]       # every draft failed: all rounds were k = 0
    assert rounds[1].failure == "error" and all(r.k == 0 for r in rounds)


def test_a_shared_planner_stops_every_sequence_drafting_while_the_draft_is_down(pair_dir):
    planner = Planner(8, down_s=60.0)
    reqs = [Request(p, MAX_TOKENS, 4) for p in prompts(3)]
    # The three sequences' first proposals are in flight together, and all fail.
    results, drafter, rounds = run(pair_dir, reqs, {0: "error", 1: "error", 2: "error"},
                                   planner=planner)
    assert len(drafter.calls) == 3 and sum(r.failure is not None for r in rounds) == 3
    assert sum(r.reason == "draft_down" for r in rounds) > 3 * (MAX_TOKENS // 2)


def test_one_failed_call_among_good_ones_does_not_stop_the_others(pair_dir):
    planner = Planner(8, down_s=60.0)
    reqs = [Request(p, MAX_TOKENS, 4) for p in prompts(3)]
    results, drafter, rounds = run(pair_dir, reqs, {0: "error"}, planner=planner)
    assert sum(r.failure is not None for r in rounds) == 1
    assert not planner.failing and len(drafter.calls) > 10   # the others' calls came back fine


def test_a_draft_slow_to_release_does_not_hold_the_finished_sequence(pair_dir):
    """A draft model restarting answers its release only when it is back (seconds): the
    finished sequence frees its slot without it, once the target's release is done, and the
    draft's release still lands (its calls stay in order)."""
    target, draft = engines(pair_dir)
    released = []

    async def main():
        back = asyncio.Event()   # the draft model is back: its release answers

        class SlowRelease(LocalDrafter):
            async def release(self, seq_id):
                await back.wait()
                await super().release(seq_id)
                released.append(seq_id)

        # Held by the draft's release, the generation would never end: the timeout fails it.
        await asyncio.wait_for(speculate(1, Request(prompts(1)[0], 8, 3), SlowRelease(draft),
                                         LocalVerifier(target), target.max_len,
                                         lambda chunk: None), 60)
        assert target.pool.active == 0 and draft.pool.active == 1 and not released
        back.set()
        for _ in range(500):
            if released:
                break
            await asyncio.sleep(0.01)
        assert released == [1] and draft.pool.active == 0

    asyncio.run(main())
