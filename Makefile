# Two commands do everything on a fresh machine:
#   make serve   install into .venv, then run tritonserver on model_repository (8000/8001/8002)
#                and the OpenAI API beside it (9000)
#   make test    install into .venv, then run the whole test suite (starts its own tritonserver)

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is installed first, on its own, from the index pip is set up with. Which build that is
# depends on the index: from PyPI alone torch==2.13.0 is the CUDA build (several GB of nvidia-*
# wheels, CPU or not); a CPU build (2.13.0+cpu) comes from a CPU index or a local wheel directory
# in pip's configuration (find-links, as on this project's CI machines). With a CPU index:
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cpu
# TORCH_INDEX is an extra index: torch's own dependencies still come from the usual one, and
# 2.13.0+cpu ranks above PyPI's 2.13.0, so pip takes the CPU build.
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
STAMP := $(VENV)/.installed

.PHONY: serve test install models draft clean loadtest bench tune soak storm

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check \
		$(if $(TORCH_INDEX),--extra-index-url "$(TORCH_INDEX)") "$(TORCH)"
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[serve,client,test]"
	touch $(STAMP)

# Loopback only unless asked: make serve ADDRESS=0.0.0.0. The OpenAI API on OPENAI_PORT (0: off).
ADDRESS ?= 127.0.0.1
OPENAI_PORT ?= 9000
serve: $(STAMP)
	$(PY) -m specdec.launcher.launch --address $(ADDRESS) --openai-port $(OPENAI_PORT)

test: $(STAMP)
	$(PY) -m pytest -q --durations=25

# Rebuild the embedded default pair (tokenizer, target, distilled draft) from the stdlib source.
models: $(STAMP)
	$(PY) scripts/make_default_models.py

# Train a draft for a target with `specdec distill` (docs/distill.md), e.g.
#   make draft TARGET=/models/Llama-3.1-8B-Instruct OUT=/models/llama-8b-draft DISTILL_ARGS="--prompts p.jsonl"
# An interrupted run resumes when the same command is run again.
TARGET ?= models/default/target
OUT ?= out/draft
DISTILL_ARGS ?=
draft: $(STAMP)
	$(VENV)/bin/specdec distill --target $(TARGET) --out $(OUT) $(DISTILL_ARGS)

clean:
	rm -rf $(VENV) .triton .pytest_cache

# One benchmark run (starts and stops its own tritonserver): markdown on stdout, JSON in reports/.
#   make bench BENCH_ARGS=--quick
BENCH_ARGS ?=
bench: $(STAMP)
	$(PY) benchmarks/bench.py $(BENCH_ARGS)

# Measure a pair on your own prompts: the best K and whether speculation pays (docs/tune.md).
#   make tune TUNE_ARGS="--target /models/t --draft /models/d --prompts p.jsonl --url 127.0.0.1:8001"
TUNE_ARGS ?=
tune: $(STAMP)
	$(VENV)/bin/specdec tune $(TUNE_ARGS)

# Load test a running server (docs/loadtest.md): make loadtest USERS=8 DURATION=2m K=4,0
USERS ?= 4
SPAWN_RATE ?= $(USERS)
DURATION ?= 30s
HOST ?= http://127.0.0.1:8000
GRPC_HOST ?=
K ?= auto,4,0
MAX_TOKENS ?= 64
REPORTS ?= reports
LOCUST_ARGS ?=

loadtest: $(STAMP)
	mkdir -p $(REPORTS)
	$(VENV)/bin/locust -f loadtest/locustfile.py --headless --only-summary \
		-u $(USERS) -r $(SPAWN_RATE) -t $(DURATION) --host $(HOST) \
		$(if $(GRPC_HOST),--grpc-host $(GRPC_HOST)) --num-draft-tokens $(K) --max-tokens $(MAX_TOKENS) \
		--csv $(REPORTS)/loadtest --html $(REPORTS)/loadtest.html $(LOCUST_ARGS)

# Soak (docs/reliability.md): a server of its own, locust at saturation (HTTP SSE and gRPC,
# K auto/4/0, a tenth of the requests cancelled), memory of every server process, leaked slots.
#   make soak SOAK_DURATION=10m
SOAK_DURATION ?= 10m
soak: $(STAMP)
	$(PY) -m loadtest.soak --duration $(SOAK_DURATION) --out $(REPORTS)

# Disconnect storm (docs/reliability.md): a server of its own under the launcher, gRPC clients
# cutting streams abruptly; crashes per 1000 abrupt disconnects and the time back to exact output.
#   make storm STORM_DURATION=5m STORM_HEADER=always
STORM_DURATION ?= 5m
STORM_HEADER ?= half
STORM_ARGS ?=
storm: $(STAMP)
	$(PY) -m loadtest.storm --duration $(STORM_DURATION) --header $(STORM_HEADER) --out $(REPORTS) \
		$(STORM_ARGS)
