"""Every repository path the README and docs/*.md name exists, and every relative link lands.

A path is a whitespace-separated token inside inline backticks that starts with one of the
repository's top-level source folders or files (`specdec/decoding/loop.py`,
`tests/core/test_policy.py::t`, `model_repository/*/1/model.py`,
`benchmarks/results/run.{json,md}`); output locations written by a command (`--out X`, `--json X`,
`> X`) and placeholders (`<dir>`) are not paths to check.
"""
import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP_LEVEL = ("benchmarks", "client", "deploy", "docs", "loadtest", "model_repository", "models",
             "scripts", "specdec", "tests", "Dockerfile", "Makefile", "pyproject.toml",
             "constraints.txt", "README.md", ".ci",
             "specdec_client")   # the client package lives in client/: name it by that path
# Files of other repositories that the docs name in backticks, not files of this one. Empty:
# the docs link such files by URL instead.
UPSTREAM: set[str] = set()
OUTPUT_FLAGS = {"--out", "--json", ">", "--output", "-o"}

INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    # Fenced blocks hold commands and their outputs (files a reader will make), not references.
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _expand_braces(token: str) -> list[str]:
    parts = re.split(r"(\{[^{}]*\})", token)
    choices = [p[1:-1].split(",") if p.startswith("{") and p.endswith("}") else [p]
               for p in parts]
    return ["".join(c) for c in itertools.product(*choices)]


def _clean(token: str) -> str | None:
    token = token.split("::")[0].split("#")[0]
    token = re.sub(r":\d+(-\d+)?$", "", token).rstrip(".,;:)")
    if "<" in token or "$" in token or "=" in token:
        return None
    first = token.split("/")[0]
    if first not in TOP_LEVEL or ("/" not in token and "." not in token[1:]
                                  and token not in ("Dockerfile", "Makefile")):
        return None    # a bare folder or package name is a word as often as a path
    return token


def named_paths(text: str) -> list[str]:
    paths = []
    for code in INLINE_CODE.findall(_prose(text)):
        tokens = code.split()
        for i, token in enumerate(tokens):
            if i and tokens[i - 1] in OUTPUT_FLAGS:
                continue
            token = token.split("=", 1)[1] if token.startswith("--") and "=" in token else token
            path = _clean(token)
            if path:
                paths.extend(_expand_braces(path))
    return paths


def _exists(path: str) -> bool:
    if any(ch in path for ch in "*?["):
        return any(ROOT.glob(path))
    return (ROOT / path).exists()


def github_anchor(heading: str) -> str:
    heading = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    return {github_anchor(m) for m in
            re.findall(r"^#{1,6} (.+)$", _prose(doc.read_text()), flags=re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_named_path_exists(doc):
    missing = sorted({p for p in named_paths(doc.read_text())
                      if p not in UPSTREAM and not _exists(p)})
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_relative_link_lands(doc):
    broken = []
    for target in LINK.findall(_prose(doc.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)} links to what does not exist: {broken}"


def test_the_extractor_finds_paths_and_skips_outputs_and_placeholders():
    text = ("See `specdec/decoding/loop.py:12`, `tests/core/test_policy.py::test_x`, "
            "`benchmarks/results/r.{json,md}` and `python benchmarks/bench.py --out reports/x.json`;"
            " not `--out benchmarks/results/new.json`, `<dir>/model.py`, `specdec.decoding.loop`, "
            "`docs` alone.\n```\nspecdec/in_a_fence.py\n```\n`models/default/`")
    assert named_paths(text) == [
        "specdec/decoding/loop.py", "tests/core/test_policy.py", "benchmarks/results/r.json",
        "benchmarks/results/r.md", "benchmarks/bench.py", "models/default/"]
    assert github_anchor("Speedup of each proposer (2026-11-24, `compare.py`)") == \
        "speedup-of-each-proposer-2026-11-24-comparepy"
