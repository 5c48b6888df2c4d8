"""batching.Batcher: a turn's calls go as one batch, calls made while a batch is in flight go
together next, and every caller hears its own result or error."""
import asyncio

import pytest

from specdec.decoding.batching import Batcher


class Recorder:
    def __init__(self, delay: float = 0.0, fail: Exception | None = None):
        self.batches: list[list] = []
        self.delay, self.fail = delay, fail

    async def run(self, calls: list) -> list:
        self.batches.append(list(calls))
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        return [ValueError(f"bad {c}") if c < 0 else c * 10 for c in calls]


def test_a_turns_calls_are_one_batch_and_errors_stay_with_their_call():
    r = Recorder()

    async def main():
        b = Batcher(r.run)
        return await asyncio.gather(*(b.submit(c) for c in (1, -2, 3)), return_exceptions=True)

    one, two, three = asyncio.run(main())
    assert r.batches == [[1, -2, 3]]
    assert (one, three) == (10, 30) and isinstance(two, ValueError) and "bad -2" in str(two)


def test_rounds_stay_together_while_a_batch_is_in_flight():
    """Sequences that start apart (two arrive while the first one's call runs) share every
    batch after, as in a GPU engine's continuous batching."""
    r = Recorder()
    late: list[asyncio.Task] = []

    async def sequence(b: Batcher, rounds: int) -> list[int]:
        return [await b.submit(i) for i in range(rounds)]

    async def run(calls):
        if not late:   # the first batch is in flight: two sequences arrive
            late.extend(asyncio.ensure_future(sequence(b, 3)) for _ in range(2))
            for _ in range(3):
                await asyncio.sleep(0)
        return await r.run(calls)

    async def main():
        nonlocal b
        b = Batcher(run)
        first = await sequence(b, 4)
        return [first] + [await t for t in late]

    b = None
    assert asyncio.run(main()) == [[0, 10, 20, 30], [0, 10, 20], [0, 10, 20]]
    # The first call goes alone; the two made while it ran go with the first sequence's next,
    # and from then on every round is one batch.
    assert r.batches == [[0], [0, 0, 1], [1, 1, 2], [2, 2, 3]]


def test_a_failed_batch_fails_each_caller_and_the_next_batch_runs():
    r = Recorder(fail=RuntimeError("model down"))

    async def main():
        b = Batcher(r.run)
        first = await asyncio.gather(b.submit(1), b.submit(2), return_exceptions=True)
        r.fail = None
        return first, await b.submit(3)

    first, after = asyncio.run(main())
    assert all(isinstance(e, RuntimeError) and "model down" in str(e) for e in first)
    assert after == 30


def test_max_rows_splits_a_batch():
    r = Recorder()

    async def main():
        b = Batcher(r.run, max_rows=2)
        return await asyncio.gather(*(b.submit(c) for c in range(5)))

    assert asyncio.run(main()) == [0, 10, 20, 30, 40]
    assert r.batches == [[0, 1], [2, 3], [4]]


def test_a_run_that_answers_the_wrong_number_of_results_fails_its_batch():
    async def short(calls):
        return calls[:-1]

    async def main():
        b = Batcher(short)
        return await asyncio.gather(b.submit(1), b.submit(2), return_exceptions=True)

    for result in asyncio.run(main()):
        assert isinstance(result, RuntimeError) and "1 results for 2 calls" in str(result)


def test_a_cancelled_caller_does_not_stop_the_others():
    r = Recorder(delay=0.01)

    async def main():
        b = Batcher(r.run)
        doomed = asyncio.ensure_future(b.submit(1))
        kept = asyncio.ensure_future(b.submit(2))
        await asyncio.sleep(0.002)
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        return await kept, await b.submit(3)

    assert asyncio.run(main()) == (20, 30)


def test_max_prefill_splits_a_burst_of_prompts_and_running_rows_never_wait():
    """Calls here are (name, prompt tokens): a burst of prompts goes in pieces of at most 100
    prompt tokens, first come first served (the small prompt behind the one that waits waits
    too), one longer than that alone; rounds of running sequences (0) go with every piece."""
    r = Recorder()

    async def run(calls):
        await r.run([0] * len(calls))
        r.batches[-1] = [name for name, _ in calls]
        return calls

    async def main():
        b = Batcher(run, max_prefill=100, prefill=lambda c: c[1])
        first = [b.submit(c) for c in [("a", 60), ("x", 0), ("b", 30), ("c", 50), ("d", 5),
                                       ("e", 250), ("y", 0), ("f", 40)]]
        await asyncio.gather(*first)
        return await asyncio.gather(*(b.submit(c) for c in [("g", 101), ("z", 0)]))

    assert asyncio.run(main()) == [("g", 101), ("z", 0)]
    assert r.batches == [["a", "x", "b", "y"], ["c", "d"], ["e"], ["f"], ["g", "z"]]
