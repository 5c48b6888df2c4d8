"""`specdec <command>`: the project's tools for users with their own checkpoints.

Each command lives in its own module with `add_arguments(parser)` and `run(args) -> int`; it is
imported only when chosen, so `specdec --help` stays fast and a command's heavy imports (torch,
transformers) load only for it.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "tune": ("specdec.tune.cli", "measure a target/draft pair on your prompts: the best K and "
                                 "whether speculation pays"),
    "distill": ("specdec.distill.cli", "train a draft model from the target itself"),
    "probe": ("specdec.serving.probe", "check that every model a request needs answers (probes)"),
    "openai": ("specdec.openai.cli", "serve the OpenAI API (chat and completions) in front of "
                                     "the ensemble"),
}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in COMMANDS:
        ap = argparse.ArgumentParser(prog="specdec", description=__doc__.splitlines()[0])
        sub = ap.add_subparsers(dest="command", metavar="command", required=True)
        for name, (_, help_text) in COMMANDS.items():
            sub.add_parser(name, help=help_text, add_help=False)
        ap.parse_args(argv)   # prints usage, or the error naming an unknown command
        return 2
    module_name, help_text = COMMANDS[argv[0]]
    module = importlib.import_module(module_name)
    ap = argparse.ArgumentParser(prog=f"specdec {argv[0]}", description=help_text)
    module.add_arguments(ap)
    return module.run(ap.parse_args(argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
