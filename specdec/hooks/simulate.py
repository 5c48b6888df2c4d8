"""A simulated device, for benchmarks only: every engine call takes at least the time a cost table
gives for the same call on another device (say an H100 in bf16). The call computes for real (the
tiny models still choose the tokens, so acceptance is real), then the process sleeps out the rest
of the simulated time, idle as it would be while a GPU computes. What a server adds around the
calls (BLS, queues, stubs, the orchestrator) is then measured against GPU-sized calls instead of
the CPU's own slow compute.

A table (JSON) holds, per batch size, the quantities benchmarks/costs.py measures on a device:

    {"format": "specdec-simulated-costs/1", "device": "...", "context": 512,
     "prefill_ms_per_token": {"target": 0.025, "draft": 0.004},
     "batches": {"1": {"step_ms": 6.2,                      # the target's one-token step
                       "verify_ms": {"1": 6.2, ..., "8": 6.3},  # a forward over 1 + k tokens
                       "propose_ms": {"1": 1.1, ...},        # the draft model drafting k tokens
                       "head_verify_ms": {"1": 6.7, ...}},   # verify_ms[k] + an EAGLE-3 head's
                 "4": {...}}}                                #   catch-up and k drafts

propose_ms and head_verify_ms are needed only to simulate a draft model or a head. Between the
table's batch sizes and k the cost is linear; beyond them it goes on along the last segment. A
call whose tokens a row outrun the table's k (a prefill) costs a step plus prefill_ms_per_token
for each token of the batch. benchmarks/sim_tables.py writes tables (derived ones, or one from
a costs.py result measured on your own GPU); docs/simulated.md says how they are derived.

One device for the machine: draft and target on one GPU share it, so by default every padded
call holds the simulated device (an flock on a file in tempfile.gettempdir(), i.e. $TMPDIR) from
its start to its padded end, and calls of different processes (draft_model's and
target_model's) run one after another as kernels on one GPU would, never overlapping.
SPECDEC_SIMULATE_SHARED=0 gives each process a device of its own (a draft on a GPU of its own).

    engine = pad(engine, load_table("benchmarks/sim/h100-8b-1b.json"), "target", shared_device())
    # served: SPECDEC_SIMULATE=benchmarks/sim/h100-8b-1b.json (engine_model.py calls from_env)
"""
from __future__ import annotations

import fcntl
import json
import os
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..records import Proposer

FORMAT = "specdec-simulated-costs/1"
ENV = "SPECDEC_SIMULATE"
SCALE_ENV = "SPECDEC_SIMULATE_SCALE"   # every time x this: a slower device, where the CPU's
                                      # own compute would outrun the table's times
SHARED_ENV = "SPECDEC_SIMULATE_SHARED"   # 1 (default): one device for every padded process
LOCK_NAME = "specdec-simulated-device.lock"
VERIFY, PROPOSE, HEAD = "verify", "propose", "head"
_CURVES = ("verify_ms", "propose_ms", "head_verify_ms")


class TableError(ValueError):
    pass


def _interp(points: dict[int, float], x: float) -> float:
    """Piecewise linear through sorted points, extended along the end segments."""
    xs = sorted(points)
    if len(xs) == 1:
        return points[xs[0]]
    i = 1
    while i < len(xs) - 1 and x > xs[i]:
        i += 1
    x0, x1 = xs[i - 1], xs[i]
    y0, y1 = points[x0], points[x1]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass
class CostTable:
    device: str
    batches: dict[int, dict]                 # b -> {"step_ms": float, curve: {k: ms}}
    prefill_ms_per_token: dict[str, float]   # "target" (and "draft" with propose_ms)
    source: str = ""
    scale: float = 1.0

    def has(self, curve: str) -> bool:
        return all(curve in row for row in self.batches.values())

    def _at(self, rows: int, curve: str, k: float) -> float:
        """ms of `curve` at k for `rows` rows; verify_ms at k = 0 is the step."""
        def one(row: dict) -> float:
            points = dict(row[curve])
            if curve == "verify_ms":
                points[0] = row["step_ms"]
            return _interp(points, k)
        return _interp({b: one(row) for b, row in self.batches.items()}, rows)

    def max_k(self, curve: str) -> int:
        return min(max(row[curve]) for row in self.batches.values())

    def seconds(self, kind: str, rows: int, tokens: int, k: int) -> float:
        """A call's simulated seconds. verify: a target forward over `tokens` committed tokens
        plus k drafts per row (a prefill past the table's k); propose: the draft model feeding
        `tokens` and drafting k; head: an EAGLE-3 head's catch-up and k drafts inside a
        verification (head_verify_ms less verify_ms)."""
        if rows <= 0:
            return 0.0
        if kind == VERIFY:
            n = tokens + k - 1
            if n <= self.max_k("verify_ms"):
                ms = self._at(rows, "verify_ms", n)
            else:
                ms = self._at(rows, "verify_ms", 0) + \
                    self.prefill_ms_per_token["target"] * rows * (tokens + k)
        elif kind == PROPOSE:
            ms = self._at(rows, "propose_ms", k)
            if tokens - 1 > self.max_k("propose_ms"):
                ms += self.prefill_ms_per_token["draft"] * rows * tokens
        elif kind == HEAD:
            ms = max(0.0, self._at(rows, "head_verify_ms", k) - self._at(rows, "verify_ms", k)) \
                if k > 0 else 0.0
        else:
            raise ValueError(f"unknown call kind {kind!r}: {VERIFY}, {PROPOSE} or {HEAD}")
        return ms * self.scale / 1e3


def _number(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise TableError(f"{where} must be a number >= 0, not {value!r}")
    return float(value)


def _int_key(key: str, where: str) -> int:
    try:
        n = int(key)
    except (TypeError, ValueError):
        raise TableError(f"{where}: key {key!r} is not an integer") from None
    if n < 1:
        raise TableError(f"{where}: key {key!r} must be >= 1")
    return n


def parse_table(data: dict, source: str = "<table>") -> CostTable:
    """Check a table and build it; a bad one is refused naming the field."""
    if not isinstance(data, dict):
        raise TableError(f"{source}: a table is a JSON object")
    if "runs" in data:
        raise TableError(f"{source}: a benchmarks/costs.py result, not a table: write one with "
                         f"benchmarks/sim_tables.py --from-costs {source}")
    if data.get("format") != FORMAT:
        raise TableError(f"{source}: format is {data.get('format')!r}, expected {FORMAT!r}")
    if not isinstance(data.get("device"), str) or not data["device"]:
        raise TableError(f"{source}: device must name the (simulated) device")
    pre = data.get("prefill_ms_per_token")
    if not isinstance(pre, dict) or "target" not in pre:
        raise TableError(f"{source}: prefill_ms_per_token must be an object with 'target'")
    prefill = {who: _number(v, f"{source}: prefill_ms_per_token.{who}") for who, v in pre.items()}
    raw = data.get("batches")
    if not isinstance(raw, dict) or not raw:
        raise TableError(f"{source}: batches must be a non-empty object of batch size -> costs")
    batches: dict[int, dict] = {}
    for key, row in raw.items():
        where = f"{source}: batches.{key}"
        b = _int_key(key, f"{source}: batches")
        if not isinstance(row, dict):
            raise TableError(f"{where} must be an object")
        out = {"step_ms": _number(row.get("step_ms"), f"{where}.step_ms")}
        if out["step_ms"] <= 0:
            raise TableError(f"{where}.step_ms must be > 0, not {row['step_ms']!r}")
        for curve in _CURVES:
            if curve not in row:
                if curve == "verify_ms":
                    raise TableError(f"{where}.verify_ms is missing")
                continue
            if not isinstance(row[curve], dict) or not row[curve]:
                raise TableError(f"{where}.{curve} must be a non-empty object of k -> ms")
            out[curve] = {_int_key(k, f"{where}.{curve}"): _number(v, f"{where}.{curve}.{k}")
                          for k, v in row[curve].items()}
        batches[b] = out
    table = CostTable(data["device"], dict(sorted(batches.items())), prefill, source)
    for curve in ("propose_ms", "head_verify_ms"):
        some = [b for b, row in table.batches.items() if curve in row]
        if some and len(some) != len(table.batches):
            raise TableError(f"{source}: batches.{some[0]}.{curve} is given, but not at every "
                             f"batch size")
    if table.has("propose_ms") and "draft" not in prefill:
        raise TableError(f"{source}: prefill_ms_per_token.draft is missing (propose_ms is given)")
    return table


def load_table(path: str | Path, scale: float = 1.0) -> CostTable:
    if not scale > 0:
        raise TableError(f"{SCALE_ENV}: scale must be > 0, not {scale!r}")
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise TableError(f"{ENV}: cannot read cost table {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise TableError(f"{path}: not JSON: {e}") from None
    table = parse_table(data, str(path))
    table.scale = scale
    return table


class Device:
    """The one simulated device that a lock file names: a call holds it from its start to its
    padded end. Re-entrant in a process (a co-located draft's calls run inside the target's
    verification); one open file per process, as flock excludes open files, not processes."""
    _open: dict[str, "Device"] = {}

    def __new__(cls, path: str | Path):
        key = str(Path(path).resolve())
        if key not in cls._open:
            dev = super().__new__(cls)
            dev.path, dev.fd, dev.depth, dev.mutex = Path(key), None, 0, threading.RLock()
            cls._open[key] = dev
        return cls._open[key]

    @contextmanager
    def hold(self):
        with self.mutex:
            if self.depth == 0:
                if self.fd is None:
                    self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
                fcntl.flock(self.fd, fcntl.LOCK_EX)
            self.depth += 1
            try:
                yield
            finally:
                self.depth -= 1
                if self.depth == 0:
                    fcntl.flock(self.fd, fcntl.LOCK_UN)


def shared_device(env=os.environ) -> Device | None:
    """$SPECDEC_SIMULATE_SHARED: 1 (unset): the machine's one device, its lock file in
    tempfile.gettempdir(); 0: None, every process a device of its own."""
    value = env.get(SHARED_ENV, "1")
    if value not in ("0", "1"):
        raise TableError(f"{SHARED_ENV}={value!r}: 1 (draft and target share one simulated "
                         f"device) or 0 (a device each)")
    return Device(Path(tempfile.gettempdir()) / LOCK_NAME) if value == "1" else None


@dataclass
class SimStats:
    calls: int = 0
    over: int = 0              # calls whose real compute already took longer than the table's
    real_s: float = 0.0
    simulated_s: float = 0.0
    over_s: float = 0.0        # how much longer than the table's those calls took
    waited_s: float = 0.0      # for the shared device, before the call could start
    by_kind: dict[str, int] = field(default_factory=dict)


@contextmanager
def _held(device: Device | None, stats: SimStats):
    """The device for the call's whole interval (none: nothing to wait for)."""
    if device is None:
        yield
        return
    t0 = time.perf_counter()
    with device.hold():
        stats.waited_s += time.perf_counter() - t0
        yield


def _finish(stats: SimStats, t0: float, seconds: float, kind: str) -> None:
    """Sleep until `seconds` after t0; count what the call was."""
    real = time.perf_counter() - t0
    stats.calls += 1
    stats.by_kind[kind] = stats.by_kind.get(kind, 0) + 1
    stats.real_s += real
    stats.simulated_s += max(real, seconds)
    if real > seconds:
        stats.over += 1
        stats.over_s += real - seconds
    elif seconds - real > 0:
        time.sleep(seconds - real)


def pad(engine, table: CostTable, role: str, device: Device | None = None):
    """Make engine's propose (role draft) or verify (role target, with its head's drafting when
    it serves one) take at least the table's time, holding `device` (shared_device()) from each
    call's start to its padded end when given; returns the engine. Its SimStats are
    engine.simulated."""
    if role not in ("draft", "target"):
        raise ValueError(f"role must be draft or target, not {role!r}")
    if role == "draft" and not table.has("propose_ms"):
        raise TableError(f"{table.source}: no propose_ms, so it cannot simulate a draft model")
    head = getattr(engine, "head", None) is not None
    if role == "target" and head and not table.has("head_verify_ms"):
        raise TableError(f"{table.source}: no head_verify_ms, so it cannot simulate an EAGLE-3 "
                         f"head's drafting")
    colocated = getattr(engine, "drafters", {}).get(Proposer.DRAFT) if role == "target" else None
    if colocated is not None and not table.has("propose_ms"):
        raise TableError(f"{table.source}: no propose_ms, so it cannot simulate the draft model "
                         f"drafting in the target's process")
    stats = SimStats()
    engine.simulated = stats
    if role == "draft":
        real = engine.propose

        def propose(calls):
            with _held(device, stats):
                t0 = time.perf_counter()
                out = real(calls)
                ok = [c for c, r in zip(calls, out) if not isinstance(r, Exception)]
                s = table.seconds(PROPOSE, len(ok), max((len(c.tokens) for c in ok), default=0),
                                  max((c.k for c in ok), default=0))
                _finish(stats, t0, s, PROPOSE)
            return out
        engine.propose = propose
        return engine

    real = engine.verify
    # A draft model in the target's process drafts inside the verification: its calls are
    # padded as draft_model's are (it sleeps them out there), and the verification lasts its
    # own time on top of theirs (the device is held once, through both).
    inner = pad(colocated.engine, table, "draft", device).simulated \
        if colocated is not None else None

    def verify(calls):
        with _held(device, stats):
            t0 = time.perf_counter()
            drafted_before = inner.simulated_s if inner is not None else 0.0
            out = real(calls)
            ok = [(c, r) for c, r in zip(calls, out) if not isinstance(r, Exception)]
            s = table.seconds(VERIFY, len(ok), max((len(c.tokens) for c, _ in ok), default=0),
                              max((r.batch_k for _, r in ok), default=0))
            drafting = [r for c, r in ok if c.next_k is not None and c.next_by == Proposer.EAGLE]
            if head and drafting:
                s += table.seconds(HEAD, len(drafting), 1, max(r.steps for r in drafting))
            if inner is not None:
                s += inner.simulated_s - drafted_before
            _finish(stats, t0, s, VERIFY)
        return out
    engine.verify = verify
    return engine


def from_env(engine, role: str, env=os.environ):
    """pad(engine) with the table $SPECDEC_SIMULATE names, said loudly; unset or no engine: the
    engine as it is."""
    path = env.get(ENV, "")
    if not path or engine is None:
        return engine
    try:
        scale = float(env.get(SCALE_ENV, "1"))
    except ValueError:
        raise TableError(f"{SCALE_ENV}={env[SCALE_ENV]!r} is not a number") from None
    table = load_table(path, scale)
    device = shared_device(env)
    where = f"one device shared through {device.path}" if device else "a device of its own"
    print(f"*** {ENV}={path}: {role}_model's engine calls are padded to SIMULATED times of "
          f"{table.device} x {scale:g} ({where}). For benchmarks only: this server is slowed "
          f"on purpose. ***",
          file=sys.stderr, flush=True)
    engine = pad(engine, table, role, device)
    if env.get(STATS_ENV):
        colocated = getattr(engine, "drafters", {}).get(Proposer.DRAFT)
        engine.simulated_publisher = _publish(
            [engine.simulated] + ([colocated.engine.simulated] if colocated else []),
            Path(env[STATS_ENV]) / f"{STATS_PREFIX}{role}-{os.getpid()}.json")
    return engine


# $SPECDEC_SIMULATE_STATS (a directory): a served engine's SimStats are rewritten there every
# PUBLISH_S, where benchmarks read whether the CPU's real compute outran the table there too.
STATS_ENV = "SPECDEC_SIMULATE_STATS"
STATS_PREFIX = "specdec-simulated-stats-"
PUBLISH_S = 0.25
PUBLISHED = ("calls", "over", "over_s")   # the SimStats fields published


def _publish(stats: list[SimStats], path: Path) -> threading.Event:
    """Starts the writer; setting the returned event stops it."""
    stop = threading.Event()

    def run():
        while True:
            total = {key: sum(getattr(s, key) for s in stats) for key in PUBLISHED}
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(total))
            tmp.replace(path)
            if stop.wait(PUBLISH_S):
                return
    threading.Thread(target=run, name="simulated-stats", daemon=True).start()
    return stop


def published(directory: Path) -> dict[str, float]:
    """The served engines' SimStats summed (PUBLISHED), as last published."""
    out = dict.fromkeys(PUBLISHED, 0.0)
    for path in Path(directory).glob(f"{STATS_PREFIX}*.json"):
        try:
            for key, value in json.loads(path.read_text()).items():
                out[key] += value
        except (OSError, ValueError):   # a file being replaced: the next reading has it
            pass
    return out
