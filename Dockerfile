# openclaw-launch as a container entrypoint. It is safe as PID 1: it reaps every zombie in the
# container and forwards SIGTERM/SIGINT/... to the workers (docker stop), then exits 128+signal.
# Base it on your CUDA + PyTorch image; numactl is the only system package it needs.
#   docker build -t trainer . && docker run --gpus all trainer --nproc-per-node 8 train.py
ARG BASE=pytorch/pytorch:latest
FROM ${BASE}
RUN apt-get update && apt-get install -y --no-install-recommends numactl && rm -rf /var/lib/apt/lists/*
COPY . /opt/openclaw-launch
RUN pip install --no-cache-dir /opt/openclaw-launch
WORKDIR /workspace
ENTRYPOINT ["openclaw-launch"]
