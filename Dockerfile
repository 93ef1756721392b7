# syntax=docker/dockerfile:1
# One file, four targets:
#   docker build --target operator      -t ascend-train/operator:0.1.0 .
#   docker build --target engine-cpu    -t ascend-train/engine-cpu:0.1.0 .
#   docker build --target engine-cuda   -t ascend-train/engine-cuda:0.1.0 .
#   docker build --target engine-ascend -t ascend-train/engine-ascend:0.1.0 \
#       --build-arg ASCEND_BASE=<a CANN / MindIE image, e.g. the one seed 002 uses> .
# Versions here must agree with pyproject.toml (a test checks).
ARG PYTHON_IMAGE=python:3.11-slim
ARG TORCH_VERSION=2.13.0
ARG MEGATRON_CORE_VERSION=0.16.1
# The MindIE image seed 002 builds on (CANN, Python 3.11); any CANN image whose CANN matches torch_npu works.
ARG ASCEND_BASE=swr.cn-south-1.myhuaweicloud.com/ascendhub/mindie:2.2.RC1-800I-A2-py311-openeuler24.03-lts

# ---------------------------------------------------------------- operator: kopf + client, no torch
FROM ${PYTHON_IMAGE} AS operator
WORKDIR /src
COPY pyproject.toml README.md ./
COPY engine engine
COPY operator operator
COPY crds crds
# The package without its dependencies, then exactly pyproject's `operator` extra (a test keeps them equal).
RUN pip install --no-cache-dir --no-deps . \
 && pip install --no-cache-dir "pydantic>=2.7,<3" "pyyaml>=6" "kopf>=1.37,<2" "kubernetes>=29" "prometheus-client>=0.19"
USER 65532:65532
ENTRYPOINT ["ascend-operator", "run"]

# ---------------------------------------------------------------- engine on CPU (tests, demos, data prep)
FROM ${PYTHON_IMAGE} AS engine-cpu
ARG TORCH_VERSION
ARG MEGATRON_CORE_VERSION
WORKDIR /src
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY engine engine
COPY operator operator
RUN pip install --no-cache-dir . "megatron-core==${MEGATRON_CORE_VERSION}"
ENTRYPOINT ["ascend-engine"]

# ---------------------------------------------------------------- engine on NVIDIA GPUs
FROM ${PYTHON_IMAGE} AS engine-cuda
ARG TORCH_VERSION
ARG MEGATRON_CORE_VERSION
WORKDIR /src
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}"
COPY pyproject.toml README.md ./
COPY engine engine
COPY operator operator
RUN pip install --no-cache-dir . "megatron-core==${MEGATRON_CORE_VERSION}"
ENTRYPOINT ["ascend-engine"]

# ---------------------------------------------------------------- engine on Ascend NPUs (CANN base image)
FROM ${ASCEND_BASE} AS engine-ascend
ARG TORCH_VERSION
ARG MEGATRON_CORE_VERSION
# torch and torch_npu must be a matching pair; the base image's CANN must match torch_npu.
ARG TORCH_NPU_VERSION=2.13.0
ARG MINDSPEED_REF=2.2.0_core_r0.12.1
WORKDIR /src
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}" "torch_npu==${TORCH_NPU_VERSION}"
# MindSpeed from its source at the pinned tag, when the build has network (optional: the engine runs without it).
RUN (git clone --depth 1 --branch "${MINDSPEED_REF}" https://gitee.com/ascend/MindSpeed.git /opt/MindSpeed \
     && pip install --no-cache-dir -e /opt/MindSpeed) || echo "MindSpeed not installed: building without it"
COPY pyproject.toml README.md ./
COPY engine engine
COPY operator operator
RUN pip install --no-cache-dir ".[npu]" "megatron-core==${MEGATRON_CORE_VERSION}"
ENV HCCL_CONNECT_TIMEOUT=1200
ENTRYPOINT ["ascend-engine"]
