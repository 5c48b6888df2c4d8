# triton-specdec on NVIDIA Triton Inference Server (see docs/deploy.md):
#   docker build -t triton-specdec:0.1.0 .
#   docker run --gpus all --shm-size=2g -p 8000-8002:8000-8002 triton-specdec:0.1.0
# Triton 2.51, CUDA 12.6, Ubuntu 22.04, Python 3.10; the image's user triton-server is uid 1000.
FROM nvcr.io/nvidia/tritonserver:24.10-py3

# torch 2.7.1 from PyPI is the CUDA 12.6 build (2.7.1+cu126, CUDA libraries as nvidia-*-cu12
# wheels): the image's own CUDA version, so it runs wherever the image runs. Not 2.5.1+cu124:
# transformers 5.x, the line that accepts constraints.txt's tokenizers 0.23.3 and
# huggingface_hub 2.4.0, ignores torch older than 2.6.
ARG TORCH_VERSION=2.7.1
# flash-attn prebuilt for torch 2.7 (C++11 ABI, like PyPI's torch 2.7), CUDA 12, CPython 3.10.
# Optional: `--build-arg FLASH_ATTN_WHEEL=` skips it and attention runs on PyTorch SDPA.
ARG FLASH_ATTN_WHEEL=https://github.com/Dao-AILab/flash-attention/releases/download/v2.8.3/flash_attn-2.8.3%2Bcu12torch2.7cxx11abiTRUE-cp310-cp310-linux_x86_64.whl

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
# Pins as in constraints.txt, except transformers: 5.20.2 is its newest release for Python 3.10.
RUN python3 -m pip install pip==26.3 \
 && python3 -m pip install torch==${TORCH_VERSION} numpy==1.26.4 safetensors==0.8.0 \
        tokenizers==0.23.3 huggingface_hub==2.4.0 transformers==5.20.2
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
# name the copied pair here. Mount your checkpoints (e.g. at /models) and override these.
ENV SPECDEC_TARGET_MODEL=/opt/specdec/models/default/target \
    SPECDEC_DRAFT_MODEL=/opt/specdec/models/default/draft \
    HF_HOME=/tmp/huggingface \
    HF_HUB_OFFLINE=1 \
    OMP_WAIT_POLICY=PASSIVE

USER 1000:1000
WORKDIR /opt/specdec
EXPOSE 8000 8001 8002
# Models load before Triton opens its ports: a long start period for large checkpoints. The
# probe makes every model a request needs run a request (a dead backend process keeps Triton's
# own /v2/health/ready at 200).
HEALTHCHECK --start-period=15m --interval=30s --timeout=10s --retries=3 \
    CMD specdec probe || exit 1
# The base image's entrypoint (nvidia_entrypoint.sh) execs this: the image's tritonserver with
# the flags `make serve` uses (launch.py: backend config, explicit model control for the
# supervisor's restarts, the model-repository APIs closed), on every interface of the container.
CMD ["python3", "-m", "specdec.serving.launch", "--tritonserver=tritonserver", \
     "--address=0.0.0.0", "--model-repository=/opt/specdec/model_repository"]
