"""Shared by the deploy tests: a Dockerfile reader and the SPECDEC_* names the code reads."""
from __future__ import annotations

import json
import re
import shlex
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
CHART = REPO / "deploy" / "helm" / "triton-specdec"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out, buf = [], ""
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#") or not s:   # comments, also inside a continuation, and blank lines
            continue
        if s.endswith("\\"):
            buf += s[:-1].rstrip() + " "
            continue
        word, _, rest = (buf + s).partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    assert not buf, f"Dockerfile ends inside a continuation: {buf!r}"
    return out


def dockerfile() -> list[tuple[str, str]]:
    return instructions(DOCKERFILE.read_text())


def comment_above(line_start: str) -> str:
    """The comment block right above the Dockerfile line that starts with `line_start` (e.g.
    "ARG FLASH_ATTN_WHEEL="), '#' stripped, lines joined with spaces."""
    lines = DOCKERFILE.read_text().splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith(line_start)]
    block = []
    for line in reversed(lines[:at]):
        if not line.startswith("#"):
            break
        block.insert(0, line.lstrip("#").strip())
    assert block, f"no comment above {line_start!r}"
    return " ".join(block)


def args_of(kind: str) -> list[str]:
    return [rest for word, rest in dockerfile() if word == kind]


def copies() -> list[tuple[list[str], str]]:
    """(sources, destination) of every COPY from the build context (not --from)."""
    out = []
    for rest in args_of("COPY"):
        words = shlex.split(rest)
        flags = [w for w in words if w.startswith("--")]
        if any(f.startswith("--from") for f in flags):
            continue
        paths = [w for w in words if not w.startswith("--")]
        assert len(paths) >= 2, f"COPY {rest!r}: needs a source and a destination"
        out.append((paths[:-1], paths[-1]))
    return out


def copy_destination(source: str) -> str:
    """Where the COPY of a directory (or file) of the repository puts it in the image."""
    want = source.strip("/")
    for sources, dest in copies():
        if any(s.strip("/") == want for s in sources):
            return dest.rstrip("/")
    raise AssertionError(f"the Dockerfile COPYs no {source}")


def env() -> dict[str, str]:
    out = {}
    for rest in args_of("ENV"):
        for word in shlex.split(rest):
            assert "=" in word, f"ENV {rest!r}: use the KEY=value form"
            key, _, value = word.partition("=")
            out[key] = value
    return out


def build_args() -> dict[str, str]:
    out = {}
    for rest in args_of("ARG"):
        key, _, value = rest.partition("=")
        out[key.strip()] = value.strip().strip('"')
    return out


def cmd() -> list[str]:
    (rest,) = args_of("CMD")[-1:] or [None]
    assert rest is not None, "the Dockerfile has no CMD"
    argv = json.loads(rest)   # the exec form: no shell between docker and tritonserver
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
    return argv


def flag(argv: list[str], name: str) -> str | None:
    """The value of --name=value or --name value in argv."""
    for i, a in enumerate(argv):
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
    return None


def openai_args(argv: list[str]):
    """`specdec openai`'s arguments as its own parser reads them (the flags, no command word)."""
    import argparse

    from specdec.openai import cli

    ap = argparse.ArgumentParser(prog="specdec openai")
    cli.add_arguments(ap)
    return ap.parse_args(argv)


def pip_requirements() -> dict[str, str]:
    """name -> version of every `pkg==version` that a RUN pip-installs (ARG defaults filled in)."""
    defaults = build_args()
    out = {}
    for rest in args_of("RUN"):
        for command in re.split(r"&&|\|\||;", rest):
            words = command.split()
            if "pip" not in words or "install" not in words:
                continue
            for w in words[words.index("install") + 1:]:
                w = re.sub(r"\$\{(\w+)\}", lambda m: defaults.get(m.group(1), m.group(0)), w)
                if "==" in w:
                    name, _, version = w.partition("==")
                    out[normalize(name)] = version
    return out


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def env_names_read_by_code(monkeypatch) -> set[str]:
    """Every environment variable the settings parsers look up, recorded by running each one
    (draft, target, orchestrator, supervisor, limits, tokenizer, shutdown, the gateway's
    limits: all read through specdec/serving/settings.py) over an empty environment."""
    from specdec.openai.limits import Limits
    from specdec.serving import engine_settings, settings
    from specdec.launcher import shutdown

    seen: set[str] = set()

    class Spy(dict):
        def get(self, key, default=None):
            seen.add(key)
            return default

        def __getitem__(self, key):
            seen.add(key)
            raise KeyError(key)

        def __contains__(self, key):
            seen.add(key)
            return False

    monkeypatch.setattr(settings, "os", types.SimpleNamespace(environ=Spy()))
    for role in ("target", "draft"):
        engine_settings.EngineSettings.parse({}, role)
    settings.OrchestratorSettings.parse({})
    settings.SupervisorSettings.parse({})
    settings.RequestLimits.parse({})
    settings.tokenizer_path({})
    shutdown.ShutdownSettings.parse()
    Limits.read()
    assert seen, "settings.py read no environment variable through os.environ: update this spy"
    return seen


DASHBOARD = CHART / "dashboards" / "specdec.json"
# A Prometheus metric name in a query: ours and Triton's own.
METRIC = re.compile(r"\b((?:specdec|nv)_[a-z0-9_]+)\b")


def dashboard_metrics(dashboard: dict) -> set[str]:
    """Every metric name the dashboard's panels query."""
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"]
              if isinstance(v.get("query"), dict)]
    return {m for e in exprs for m in METRIC.findall(e)}


def missing_metrics(wanted: set[str], exported: set[str]) -> set[str]:
    """Of the names a dashboard queries, those not among the exported (a histogram's series
    are named with their _bucket, _sum and _count)."""
    return {m for m in wanted if m not in exported}
