"""What benchmarks/simulated.py runs: its settings, sampling modes, stream counts and arguments."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from inputs import DEFAULT_DRAFT, DEFAULT_PROMPTS, DEFAULT_TARGET, ROOT

DEFAULT_HEAD = ROOT / "models" / "default" / "eagle"
DEFAULT_TABLE = ROOT / "benchmarks" / "sim" / "h100-8b-1b-eagle.json"
from specdec.records import AUTO
MAX_DRAFT_TOKENS = 8        # the server's default max_draft_tokens: auto's cap
TEMPERATURE = 0.7           # the sampled mode's


@dataclass(frozen=True)
class Setting:
    label: str
    proposer: str | None    # None: target-only
    k: int                  # AUTO: the policy chooses per round


@dataclass(frozen=True)
class Mode:
    name: str
    temperature: float


def settings(k: int) -> list[Setting]:
    """Target-only, the draft model and the EAGLE-3 head at a fixed k and auto; hybrid (the
    default proposer where a head is served: lookup, else the head) at k and auto, run only
    when --proposers names it."""
    return [Setting("target-only", None, 0), Setting(f"draft K={k}", "draft", k),
            Setting("draft auto", "draft", AUTO), Setting(f"eagle K={k}", "eagle", k),
            Setting("eagle auto", "eagle", AUTO),
            Setting(f"hybrid K={k}", "hybrid", k), Setting("hybrid auto", "hybrid", AUTO)]


def modes(names: str) -> list[Mode]:
    known = {"greedy": Mode("greedy", 0.0), "sampled": Mode("sampled", TEMPERATURE)}
    out = []
    for name in names.split(","):
        if name not in known:
            raise SystemExit(f"--modes: {name!r} is not one of {', '.join(known)}")
        out.append(known[name])
    return out


def parser(description: str) -> argparse.ArgumentParser:
    """simulated.py's arguments; description: its docstring (it imports this module)."""
    ap = argparse.ArgumentParser(description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, default=DEFAULT_TARGET)
    ap.add_argument("--draft", type=Path, default=DEFAULT_DRAFT)
    ap.add_argument("--head", type=Path, default=DEFAULT_HEAD)
    ap.add_argument("--table", default=str(DEFAULT_TABLE),
                    help="the simulated device's cost table (benchmarks/sim_tables.py); none: "
                         "no padding, every engine on this machine's own device with the "
                         "server's defaults (a GPU: CUDA, bf16, graphs, the exact mode)")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="every table time x this (a slower simulated device), where the CPU's "
                         "own compute outruns the table; the report projects back to x1")
    ap.add_argument("--prompts-file", type=Path, default=DEFAULT_PROMPTS)
    ap.add_argument("--prompts", type=int, default=8, help="per run (and at least one per stream)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4, help="the fixed K of the draft model and head")
    ap.add_argument("--streams", default="1,4,16")
    ap.add_argument("--modes", default="greedy,sampled")
    ap.add_argument("--warmup", type=int, default=2,
                    help="untimed requests before each run, at least one a stream")
    ap.add_argument("--only", choices=("both", "local", "served"), default="both")
    ap.add_argument("--placements", default="auto",
                    help="the served side's placements, comma-separated: a server each, the "
                         "draft model's settings run on every one in turn (the others on the "
                         "first and on every hosted one); auto: the server's defaults (the "
                         "target's engine with the draft in speculative_decoding's process); "
                         "orchestrator: the same, set explicitly; target, separate: "
                         "$SPECDEC_DRAFT_PLACEMENT with the target's engine in target_model "
                         "($SPECDEC_TARGET_PLACEMENT=separate)")
    ap.add_argument("--servers-in-turn", action="store_true",
                    help="one server at a time, every setting in process again beside each: "
                         "where the device holds the in-process engines and one server's, not "
                         "more (three copies of an 8B pair on one 80 GB GPU)")
    ap.add_argument("--own-draft-device", action="store_true",
                    help="the draft model's calls on a simulated device of their own "
                         "(SPECDEC_SIMULATE_SHARED=0); by default draft and target share one, "
                         "as on one GPU")
    ap.add_argument("--proposers", default="none,draft,eagle",
                    help="the settings to run, by proposer (none: target-only; hybrid: lookup, "
                         "else the head)")
    ap.add_argument("--gateway", action="store_true",
                    help="every setting also through `specdec openai` in front of the first "
                         "placement's server (streamed completions; the gateway calls "
                         "speculative_decoding with token ids)")
    ap.add_argument("--quick", action="store_true",
                    help="a fast check: 2 prompts, 16 tokens, 1 and 2 streams, greedy")
    ap.add_argument("--out", type=Path, help="also write every figure as JSON")
    ap.add_argument("--py-spy", metavar="BIN",
                    help="sample every measured run's processes with this py-spy (in process: "
                         "this one; served: this one, speculative_decoding and postprocessing)")
    ap.add_argument("--profile-dir", type=Path, default=Path("py-spy"),
                    help="where --py-spy writes its raw stacks, a file a run and process")
    return ap


def parse(argv=None, description: str = "") -> argparse.Namespace:
    args = parser(description).parse_args(argv)
    if args.quick:
        args.prompts, args.max_tokens, args.streams, args.modes, args.warmup = 2, 16, "1,2", \
            "greedy", 1
    args.stream_counts = [int(s) for s in args.streams.split(",")]
    if min(args.stream_counts) < 1:
        raise SystemExit("--streams: each count must be >= 1")
    args.mode_list = modes(args.modes)
    wanted = args.proposers.split(",")
    args.setting_list = [s for s in settings(args.k) if (s.proposer or "none") in wanted]
    args.placement_list = args.placements.split(",")
    if not set(args.placement_list) <= {"auto", "target", "separate", "orchestrator"}:
        raise SystemExit(f"--placements {args.placements!r}: auto, target, separate or "
                         "orchestrator")
    args.table = None if args.table == "none" else Path(args.table)
    if not args.scale > 0:
        raise SystemExit(f"--scale {args.scale}: must be > 0")
    if not 1 <= args.k <= MAX_DRAFT_TOKENS:
        raise SystemExit(f"--k {args.k}: must be 1..{MAX_DRAFT_TOKENS}")
    return args


def seed_of(prompt: str) -> int:
    """A sampled request's seed, from its prompt: the same in process and served."""
    import zlib
    return zlib.crc32(prompt.encode())
