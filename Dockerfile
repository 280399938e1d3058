# hetplan-runtime: the image that `hetplan compile --target kubernetes` names by default
# (runtime/targets.py, K8S_IMAGE). Build it from the repository root:
#
#     docker build -t hetplan-runtime:latest .
#
# The PyTorchJob's pods run their own command, which replaces ENTRYPOINT:
#     bash -c "torchrun --nnodes=N --nproc-per-node=K ... -m hetplan.runtime.execute --spec /etc/hetplan/..."
# so the image needs bash (the Debian base has it), torchrun (installed with torch) and hetplan.
# ENTRYPOINT is that same executor, for a one-process run of a one-rank spec:
#     docker run --rm -v "$PWD/out:/spec" hetplan-runtime:latest --spec /spec/launch_spec.json --steps 2
#
# This is the CPU build: python:3.11-slim and the CPU wheel of torch 2.13.0 (gloo). For GPUs (NCCL),
# build FROM a CUDA runtime image that has Python 3.11 and pass the CUDA wheel index of the same torch
# version, e.g. --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128
FROM python:3.11-slim

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/hetplan

# torch alone first: the largest layer stays cached while hetplan's sources change.
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"

# What `pip install .` needs: pyproject.toml, the README it names, and every folder its
# [tool.setuptools.package-dir] maps to a package (tests check this list against pyproject.toml).
COPY pyproject.toml README.md ./
COPY core core
COPY estimators estimators
COPY formulations formulations
COPY solvers solvers
COPY runtime runtime
COPY simulator simulator
COPY orchestration orchestration
COPY instances instances

# A plain (not editable) install with the torch extra; the pin keeps the wheel installed above.
RUN pip install --no-cache-dir "./[torch]" "torch==${TORCH_VERSION}" \
    && python -c "import hetplan.runtime.execute, hetplan.orchestration.worker" \
    && torchrun --help > /dev/null

# The executor writes only where --log-json / --dump-params point; no need for root. A numeric
# USER lets Kubernetes check runAsNonRoot without reading /etc/passwd.
RUN useradd --create-home --uid 1000 hetplan
USER 1000
WORKDIR /home/hetplan

ENTRYPOINT ["python", "-m", "hetplan.runtime.execute"]
CMD ["--help"]
