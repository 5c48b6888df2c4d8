# triton-specdec on NVIDIA Triton Inference Server (see docs/deploy.md):
#   docker build -t triton-specdec:0.1.0 .
#   docker run --gpus all --shm-size=2g -p 8000-8002:8000-8002 -p 9000:9000 triton-specdec:0.1.0
# (8000 HTTP, 8001 gRPC, 8002 metrics: Triton; 9000: the OpenAI API, `specdec openai`)
# NGC 26.04 = Triton 2.68.0 (server tag v2.68.0), CUDA 13.2.1, Ubuntu 24.04, Python 3.12; the
# image's user triton-server is uid 1000. 26.04 is the first release with all three upstream
# fixes for the gRPC stream crashes of Triton 2.51 (server pull requests 7840, 8078, 8708;
# docs/deploy.md "Which Triton versions crash"). Driver: R575 or later per the release notes,
# R580 or later per CUDA 13's compatibility table; GPUs of compute capability 7.5 and up.
FROM nvcr.io/nvidia/tritonserver:26.04-py3

# torch 2.13.0, constraints.txt's version (the tests run its CPU build; `make serve` on a CUDA
# machine installs this one). On PyPI its cp312 manylinux_2_28_x86_64 wheel is the CUDA 13.0
# build (it requires cuda-toolkit 13.0.3 and nvidia-*-cu13 wheels, which bring the CUDA
# libraries): the image's CUDA major. Checked with `pip install --dry-run --report
# --python-version 3.12 --platform manylinux_2_28_x86_64 --only-binary=:all: torch==2.13.0`.
# NCCL, for tensor parallelism on GPUs (docs/tensor_parallel.md), comes with it: the wheel's
# METADATA requires nvidia-nccl-cu13==2.29.7 on Linux, and its torch/lib/libtorch_cuda.so needs
# libnccl.so.2 through an RPATH of $ORIGIN/../../nvidia/nccl/lib, where that wheel puts it
# (checked in the downloaded wheel, 2026-11-25). So no NCCL of our own, and never torch from a
# CPU-only index, which has no NCCL.
ARG TORCH_VERSION=2.13.0
# flash-attn: none by default. Dao-AILab's release wheels stop at torch 2.10 (flash-attn 2.8.3:
# cu13torch2.10cxx11abiTRUE-cp312; its wheel workflow maps torch versions up to 2.10 only), so
# there is no prebuilt wheel for torch 2.13 + CUDA 13 + cp312 + C++11 ABI, and this runtime image
# has no nvcc to build one. Attention runs on PyTorch SDPA. flash-attn is optional: pass a wheel
# built for exactly that combination with `--build-arg FLASH_ATTN_WHEEL=<url>`.
ARG FLASH_ATTN_WHEEL=

# The image's Python is Ubuntu's (PEP 668 "externally managed"): the base image sets
# PIP_BREAK_SYSTEM_PACKAGES=1 for its own pip installs, and so does this file, explicitly.
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
    PIP_BREAK_SYSTEM_PACKAGES=1
# pip and setuptools come from Ubuntu's python3-pip (24.0) and python3-setuptools (68.1.2)
# packages, which have no RECORD file, so pip cannot uninstall them ("Cannot uninstall pip 24.0,
# RECORD file not found"): --ignore-installed puts the new ones beside them in /usr/local, first
# on sys.path. setuptools 80.10.2: torch 2.13 requires >= 77.0.3; the 80 line still has
# pkg_resources (82 removed it), which anything in the base image may import.
# Then the pins of constraints.txt, all with cp312 (or pure-Python) wheels on PyPI, checked with
# `pip install --dry-run --python-version 3.12 --only-binary=:all:`; transformers 5.23.0 needs
# Python >= 3.11, which this image has.
RUN python3 -m pip install --ignore-installed pip==26.3 setuptools==80.10.2 \
 && python3 -m pip install torch==${TORCH_VERSION} numpy==1.26.4 safetensors==0.8.0 \
        tokenizers==0.23.3 huggingface_hub==2.4.0 transformers==5.23.0
# The OpenAI gateway (`specdec openai`, docs/openai.md): FastAPI on uvicorn (uvloop and httptools
# under it, which uvicorn picks up), and tritonclient's gRPC client to reach Triton. constraints.txt's pins, written out: tritonclient==2.73.0 with
# grpcio==1.85.1 and protobuf==6.33.6 is pyproject's tritonclient[grpc] (the extra's packaging
# comes with transformers); pydantic 2.14.3 pins its pydantic-core (2.50.4); anyio, h11, click
# and the rest follow unpinned, as transformers' own dependencies do. All have cp312 (or
# pure-Python) wheels on PyPI: checked with `pip install --dry-run --python-version 3.12
# --only-binary=:all:` together with the pins above, which they leave as they are (numpy stays
# 1.26.4: tritonclient's ml-dtypes needs >= 1.26.0 on Python 3.12).
# llguidance (an abi3 wheel, no dependencies): the grammar of structured outputs.
RUN python3 -m pip install fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 uvloop==0.23.0 \
        httptools==0.9.0 pydantic==2.14.3 tritonclient==2.73.0 grpcio==1.85.1 protobuf==6.33.6 \
        llguidance==1.9.1
# A C compiler and Python's headers for triton (torch's CUDA wheel brings triton 3.7.1): it
# compiles each kernel's launcher when the kernel is first loaded, and the exact mode's linear
# layers run a Triton kernel on CUDA (specdec/kernels/invariant_gemm.py). Without them the load probe
# fails and those layers fall back to cuBLAS over 128-row blocks, slower (docs/exactness.md).
# An engine on the CPU compiles its own kernels with the same gcc (specdec/kernels/cpu/build.py).
# Ubuntu 24.04's packages, as the base image's apt sources give them.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev python3-dev \
 && rm -rf /var/lib/apt/lists/*
RUN if [ -n "${FLASH_ATTN_WHEEL}" ]; then python3 -m pip install "${FLASH_ATTN_WHEEL}"; \
    else echo "FLASH_ATTN_WHEEL is empty: no flash-attn, PyTorch SDPA"; fi

# The project, installed (not editable; its dependencies are above) into the system Python that
# Triton's Python backend stub runs. The source copy is removed: only site-packages is imported.
COPY pyproject.toml README.md /tmp/specdec/
COPY specdec/ /tmp/specdec/specdec/
COPY client/ /tmp/specdec/client/
RUN python3 -m pip install --no-deps /tmp/specdec && rm -rf /tmp/specdec

COPY model_repository/ /opt/specdec/model_repository/
COPY models/default/ /opt/specdec/models/default/

# settings.py finds the default pair relative to a source checkout, which site-packages is not:
# SPECDEC_DEFAULT_MODELS names the copied pair's directory (target/, draft/, eagle/). Not
# SPECDEC_TARGET_MODEL / SPECDEC_DRAFT_MODEL: set by the image, a draft could not be told from a
# user's, and a user's target would be served beside the toy draft (settings.py model_paths).
# Mount your checkpoints (e.g. at /models) and set SPECDEC_TARGET_MODEL (and a draft) to them.
# TRITON_CACHE_DIR: triton's compiled kernels, where the image's user can write.
ENV SPECDEC_DEFAULT_MODELS=/opt/specdec/models/default \
    HF_HOME=/tmp/huggingface \
    TRITON_CACHE_DIR=/tmp/triton \
    HF_HUB_OFFLINE=1 \
    OMP_WAIT_POLICY=PASSIVE

USER 1000:1000
WORKDIR /opt/specdec
# Triton's HTTP, gRPC and metrics ports; 9000: the OpenAI API (`specdec openai`).
EXPOSE 8000 8001 8002 9000
# Models load before Triton opens its ports: a long start period for large checkpoints. The
# probe makes every model a request needs run a request (a dead backend process keeps Triton's
# own /v2/health/ready at 200).
HEALTHCHECK --start-period=15m --interval=30s --timeout=10s --retries=3 \
    CMD specdec probe || exit 1
# The base image's entrypoint (nvidia_entrypoint.sh) execs this, so the launcher is PID 1: it
# runs the image's tritonserver as its child with the flags `make serve` uses (launch.py: backend
# config, explicit model control for the supervisor's restarts, the model-repository APIs
# closed), on every interface of the container; reaps orphans; forwards SIGTERM/SIGINT to
# tritonserver. A tritonserver that dies after it became ready (or hangs, answering no liveness
# check for 30 s: it is killed) is started again (backoff 1 s
# doubling to 30 s, reset after 120 s of service; each cause logged as `specdec launch: ...`);
# one that never became ready is not, and the container exits with its code. `--no-restart`
# makes the launcher exec tritonserver instead (and refuses --openai-port).
# --openai-port=9000: beside tritonserver the launcher runs the OpenAI gateway (`specdec openai
# --host 0.0.0.0 --port 9000`, calling Triton's gRPC port on 127.0.0.1) as a kept companion:
# started with it, started again with the same backoff if it dies, stopped with it. Its
# readiness is GET :9000/health (503 until the ensemble answers), its liveness /health/live.
CMD ["python3", "-m", "specdec.launcher.launch", "--tritonserver=tritonserver", \
     "--address=0.0.0.0", "--model-repository=/opt/specdec/model_repository", \
     "--openai-port=9000"]
