"""Bring back a model whose backend process died: the supervisor model's loop.

Triton 2.51's Python backend never restarts a stub process that died (python_backend r24.10,
python_be.cc: the restart of an unhealthy stub went away in 24.07, and a TODO says it was never
done for decoupled models). Every later call fails with "Stub process '<model>_0_0' is not
healthy." while /v2/health/ready and the model's ready endpoint keep answering 200.

So a small model of its own, `supervisor`, watches draft_model and target_model: a thread pings
each every `interval_s` (the release of a sequence that is not open: a real execute in the
model's process, no KV slot) and unloads and loads again one that does not answer, through the
Python backend's model-loading API (explicit model control, which the launcher turns on). That
starts a new process with empty KV slots. A draft that comes back knows no sequence: the loop
re-prefills it. A target that comes back has lost every sequence in flight: those requests
already failed with the error of their call.

Why a model of its own: the Python backend holds the GIL while `load_model` waits for the load,
so in the orchestrator's process a restart would stop every stream for as long as a load takes.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

log = logging.getLogger("specdec")

# How the Python backend and Triton word a model that cannot run a request. Not "Server not
# ready": the whole server is starting or stopping, and no model is to blame.
_DEAD = "is not healthy"
_GONE = ("' is not ready", "unknown model")
MAX_BACKOFF_S = 60.0


def is_down(message: str) -> bool:
    """The model cannot run requests: its process died (or hangs), or it is not loaded."""
    return _DEAD in message or any(s in message.lower() for s in _GONE)


class Supervisor:
    """check(model) -> None when it answers, else the error message; reload(model) restarts it.
    on_restart(model, seconds) observes each successful restart (metrics)."""

    def __init__(self, models: list[str], check: Callable[[str], str | None],
                 reload: Callable[[str], None], interval_s: float,
                 on_restart: Callable[[str, float], None] = lambda model, s: None):
        self.models, self.check, self.reload = models, check, reload
        self.interval_s, self.on_restart = interval_s, on_restart
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_try = {m: 0.0 for m in models}   # monotonic time of the next restart try
        self._backoff = {m: 0.0 for m in models}
        # up: None until the model first answers. The supervisor loads with the others: one
        # still loading is not down, and is never restarted.
        self.state = {m: {"up": None, "restarts": 0, "last_restart_s": None, "error": None}
                      for m in models}

    def start(self) -> None:
        if self.interval_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="specdec-supervisor",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sweep()

    def sweep(self) -> None:
        """Check every model once; restart those that are down and due."""
        for model in self.models:
            try:
                error = self.check(model)
            except Exception as exc:   # noqa: BLE001 (a failed ping is the model's state)
                error = str(exc)
            state = self.state[model]
            if error is None or not is_down(error):   # it answered, if only with an error
                state.update(up=True, error=None)
                self._backoff[model] = 0.0
            elif state["up"] is not None:
                state.update(up=False, error=error)
                if time.monotonic() >= self._next_try[model]:
                    self._restart(model, error)

    def _restart(self, model: str, error: str) -> None:
        log.warning("%s is down (%s): restarting it", model, error)
        t0 = time.monotonic()
        try:
            self.reload(model)
        except Exception as exc:   # noqa: BLE001 (logged; retried after a backoff)
            self._backoff[model] = min(max(2 * self._backoff[model], self.interval_s),
                                       MAX_BACKOFF_S)
            self._next_try[model] = time.monotonic() + self._backoff[model]
            self.state[model]["error"] = f"restart failed: {exc}"
            log.error("%s: restart failed (%s); next try in %.0f s", model, exc,
                      self._backoff[model])
            return
        seconds = time.monotonic() - t0
        self._backoff[model] = self._next_try[model] = 0.0
        self.state[model].update(up=True, error=None, last_restart_s=round(seconds, 3),
                                 restarts=self.state[model]["restarts"] + 1)
        log.warning("%s restarted in %.1f s", model, seconds)
        self.on_restart(model, seconds)


def reload(pb, model: str) -> None:
    """Unload and load `model`: a new backend process. Loading alone would keep the instance
    (Triton reuses instances whose config did not change), and with it the dead process."""
    try:
        pb.unload_model(model)
    except Exception as exc:   # noqa: BLE001 (already unloaded: load it)
        log.info("%s: unload: %s", model, exc)
    pb.load_model(model)
