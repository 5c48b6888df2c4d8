"""courier.py on its thread: posts return at once, run in order, failures are logged not
raised, and settle() waits for everything posted before it."""
import asyncio
import logging
import threading

from specdec.serving.courier import THREAD_NAME, Courier


def test_posts_run_in_order_off_the_caller_and_settle_waits_for_them():
    courier = Courier(threaded=True)
    gate, done, order = threading.Event(), [], []

    def slow(i):
        gate.wait(5)
        order.append((i, threading.current_thread().name))

    async def main():
        for i in range(5):
            courier.post(slow, i)
        assert order == []            # the caller did not wait for the first
        courier.post(done.append, "last")
        gate.set()
        await courier.settle()
        return list(order), list(done)

    seen, last = asyncio.run(main())
    assert [i for i, _ in seen] == list(range(5)) and last == ["last"]
    assert all(name == THREAD_NAME for _, name in seen)


def test_a_failed_post_is_logged_and_the_next_ones_still_run(caplog):
    courier = Courier(threaded=True)
    ran = []

    def fail():
        raise RuntimeError("Unable to send response. Response sender has been closed.")

    async def main():
        courier.post(fail)
        courier.post(ran.append, 1)
        await courier.settle()

    with caplog.at_level(logging.ERROR, logger="specdec"):
        asyncio.run(main())
    assert ran == [1]
    assert any("sender has been closed" in r.getMessage() for r in caplog.records)


def test_unthreaded_posts_run_at_once():
    ran = []
    Courier(threaded=False).post(ran.append, 1)
    assert ran == [1]


def test_posts_on_an_event_loop_wait_for_its_turn_to_end():
    """A round's rows post their responses one after another as they go on: the courier starts
    on them once the turn ends, not while the rows still to go need the GIL. Off any event loop
    a post goes at once."""
    import time
    courier = Courier(threaded=True)
    ran = []

    async def main():
        courier.post(ran.append, 1)
        courier.post(ran.append, 2)
        time.sleep(0.05)               # the turn goes on: nothing has reached the courier
        held = list(ran)
        await courier.settle()
        return held

    assert asyncio.run(main()) == [] and ran == [1, 2]
    off = threading.Event()
    courier.post(off.set)
    assert off.wait(5)


def test_posts_held_on_a_loop_that_closed_go_with_the_next_post():
    """A loop that ends right after a post never runs the release it scheduled: the next post,
    on another loop, sends them first, in order."""
    courier = Courier(threaded=True)
    ran = []
    loop = asyncio.new_event_loop()

    def last_words():
        courier.post(ran.append, 1)
        loop.stop()   # the loop ends with this batch of callbacks: the release never runs

    loop.call_soon(last_words)
    loop.run_forever()
    loop.close()

    async def later():
        courier.post(ran.append, 2)
        await asyncio.wait_for(courier.settle(), 5)   # held behind the lost release: never

    asyncio.run(later())
    assert ran == [1, 2]
