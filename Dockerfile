# syntax=docker/dockerfile:1
# The nvrx-eks trainer image: NVIDIA PyTorch (CUDA, NCCL) + EFA (libfabric, aws-ofi-nccl) + NVRx.
#
#   docker build -t <EcrRepositoryUri>:<git commit> .                                 # NVRx 0.7.0
#   docker build --build-arg NVRX_VERSION=0.4.1 -t <EcrRepositoryUri>:nvrx-0.4.1 .   # published benchmark
# `make image` builds with the profile's nvrx_version (default: this file's).
#
# Base: NGC PyTorch 25.09 is Ubuntu 24.04 (glibc 2.39) with Python 3.12 and NCCL >= 2.26.2, the
# floor that NVRx wheels (0.5+ need glibc 2.39; 0.7 needs Python 3.12) and NVRx in-process
# restart (NCCL 2.26.2) set; NVRx 0.4.1 also ships a cp312 wheel, so both pins build on it.
FROM nvcr.io/nvidia/pytorch:25.09-py3

ARG NVRX_VERSION=0.7.0
ARG EFA_INSTALLER_VERSION=1.43.2
# Must match k8s.pod.APP_UID (the tests check): the user non-EFA pods run as.
ARG APP_UID=10001

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# EFA user space: libfabric (efa provider), rdma-core and aws-ofi-nccl, which the installer puts
# under /opt/amazon/ofi-nccl. The base image's MOFED verbs, HPC-X Open MPI and SHARP NCCL plugin
# would otherwise be found first and NCCL would not use EFA. The kernel module and the memlock
# limits belong to the host AMI (--skip-kmod --skip-limit-conf), not to the image.
WORKDIR /tmp/efa
# The installer is unpacked here and deleted in the same layer. The last two checks guard the
# manifests, which set NCCL_TUNER_PLUGIN to this path (k8s.environment): a missing plugin fails
# the build, not a training job.
RUN apt-get update \
    && apt-get remove -y --allow-change-held-packages ibverbs-utils libibverbs-dev libibverbs1 libmlx5-1 \
    && rm -rf /opt/hpcx/ompi /opt/hpcx/nccl_rdma_sharp_plugin /usr/local/mpi \
    && curl -fsSL "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" \
        | tar -xz --strip-components=1 \
    && ./efa_installer.sh -y -g -d --skip-kmod --skip-limit-conf --no-verify \
    && find . -mindepth 1 -delete \
    && rm -rf /var/lib/apt/lists/* \
    && ldconfig \
    && /opt/amazon/efa/bin/fi_info --version \
    && test -e /opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net-ofi.so \
    && test -e /opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-ofi-tuner.so
ENV PATH=/opt/amazon/efa/bin:${PATH} \
    LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu:/opt/amazon/efa/lib:${LD_LIBRARY_PATH}

# The project with the [trainer] extra only, which includes [data] (`datasets` for the data-prep
# Job). torch stays the base image's CUDA build (a constraint on its exact version stops pip
# from replacing it from PyPI); NVRx is pinned.
WORKDIR /opt/nvrx-eks
COPY pyproject.toml README.md ./
COPY config/ config/
COPY trainer/ trainer/
RUN python -c 'import importlib.metadata as m; print("torch==" + m.version("torch"))' > /tmp/constraints.txt \
    && echo "nvidia-resiliency-ext==${NVRX_VERSION}" >> /tmp/constraints.txt \
    && pip install --no-cache-dir --constraint /tmp/constraints.txt ".[trainer]" \
    && rm /tmp/constraints.txt

# Non-root by default. Training pods on EFA instances override this with uid 0 plus IPC_LOCK
# only, because Kubernetes grants added capabilities to uid 0 alone and EFA memory registration
# needs IPC_LOCK unless the node's memlock limit is unlimited (see k8s/pod.py).
RUN groupadd --gid "${APP_UID}" nvrx \
    && useradd --uid "${APP_UID}" --gid "${APP_UID}" --create-home --shell /bin/bash nvrx
USER ${APP_UID}

# Build-time smoke test: the entry points import, the pinned NVRx is the one installed, and
# aws-ofi-nccl registers the network name the manifests put in NCCL_NET (k8s.environment), so
# NCCL finds it instead of failing every EFA job at start-up.
ARG OFI_NCCL_NET="AWS Libfabric"
RUN python -c "import ctypes, sys; lib = ctypes.CDLL('/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net-ofi.so'); names = [ctypes.c_char_p.in_dll(lib, f'ncclNetPlugin_v{v}').value.decode() for v in range(10, 5, -1) if hasattr(lib, f'ncclNetPlugin_v{v}')]; sys.exit(0 if names and names[0] == '${OFI_NCCL_NET}' else f'aws-ofi-nccl registers {names}, not ${OFI_NCCL_NET}')" \
    && python -m trainer --help > /dev/null \
    && python -m trainer.recovery.launch --help > /dev/null \
    && python -m trainer.loop.data --help > /dev/null \
    && python -c "import datasets" \
    && ft_launcher --help > /dev/null \
    && python -c "import importlib.metadata as m, sys; v = m.version('nvidia-resiliency-ext'); sys.exit(0 if v == '${NVRX_VERSION}' else 'nvidia-resiliency-ext ' + v + ' != ${NVRX_VERSION}')"

# No health check: the image runs batch training under Kubernetes, which ignores an image's
# HEALTHCHECK. A hung or dead rank is NVRx's to detect (heartbeats, the in-process watchdog).
HEALTHCHECK NONE

LABEL org.opencontainers.image.title="nvrx-eks trainer" \
      org.opencontainers.image.description="FSDP LLaMA trainer with NVIDIA Resiliency Extension for EKS (EFA, aws-ofi-nccl)" \
      io.nvrx-eks.nvrx-version="${NVRX_VERSION}" \
      io.nvrx-eks.efa-installer-version="${EFA_INSTALLER_VERSION}"
CMD ["python", "-m", "trainer", "--help"]
