# openclaw-launch as a container entrypoint: safe as PID 1 (it reaps every zombie in the container,
# forwards SIGTERM/SIGINT/... to the workers on `docker stop`, then exits 128+signal; a failed
# worker's exit code is the container's). Full guide: docs/container.md.
#
# BASE is the image your training already runs in: an operators' CUDA + PyTorch image
# (nvcr.io/nvidia/pytorch, pytorch/pytorch) or a plain Debian/Ubuntu with python3 and pip.
#   docker build --build-arg BASE=nvcr.io/nvidia/pytorch:25.01-py3 -t trainer .
#   docker run --gpus '"device=GPU-<uuid>,GPU-<uuid>"' --ipc=host --ulimit memlock=-1 \
#     -v /path/config:/config trainer --config /config/cluster.yaml train.py
#
# No venv, on purpose: the launcher goes into the base's own Python, the one that has torch, since
# workers run under the launcher's interpreter (sys.executable, as torchrun) and multi-node
# launchers meet through torch.distributed's store. Debian 12+/Ubuntu 23.04+ mark that Python
# "externally managed" (PEP 668); PIP_BREAK_SYSTEM_PACKAGES=1 is set for this one pip command only.
# pip then writes to /usr/local/lib/python3*/dist-packages and touches no file of a Debian package.
# The launcher never imports torch at start and does not install one: the base's torch is used.
#
# No HEALTHCHECK: the launcher is PID 1, so "running" already means "supervising"; when a worker
# fails the container exits with its code. A hung-but-alive training is not something a probe
# of the launcher could tell apart from a slow step.
ARG BASE=pytorch/pytorch:latest
FROM ${BASE}

# numactl binds each rank to its GPU's NUMA node; the network is used only when it is missing.
RUN if ! command -v numactl >/dev/null; then \
      apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends numactl \
      && rm -rf /var/lib/apt/lists/*; \
    fi

# Only what pip needs to build the package (see .dockerignore), installed then deleted in one layer
# (the copy stays in its own small layer).
COPY pyproject.toml README.md /tmp/openclaw-launch/
COPY openclaw_launch /tmp/openclaw-launch/openclaw_launch
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir --disable-pip-version-check /tmp/openclaw-launch \
    && rm -rf /tmp/openclaw-launch \
    && ln -s "$(python3 -c 'import openclaw_launch.__main__ as m; print(m.__file__)')" /usr/local/bin/openclaw-launch-pid1 \
    && openclaw-launch --help >/dev/null && python3 -S /usr/local/bin/openclaw-launch-pid1 --version >/dev/null

# PID 1 catches SIGTERM and SIGINT before the interpreter's site import (python3 -S on the
# package's __main__.py, which runs site itself once its handlers are in: openclaw_launch/__main__.py):
# 41 ms after exec instead of 151 ms with the console script, medians on a loaded 2-core box (RESULTS.md).
WORKDIR /workspace
ENTRYPOINT ["python3", "-S", "/usr/local/bin/openclaw-launch-pid1"]
CMD ["--help"]
