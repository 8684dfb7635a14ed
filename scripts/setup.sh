#!/usr/bin/env bash
# Install everything openclaw-launch and its tests need, from nothing (Debian, root or sudo).
# Idempotent: a second run installs nothing. Usage: scripts/setup.sh [--test]
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
need_apt=()
command -v numactl >/dev/null || need_apt+=(numactl)
command -v unshare >/dev/null || need_apt+=(util-linux)
command -v ps >/dev/null || need_apt+=(procps)
if [ ${#need_apt[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
# torch==2.13.0 is pinned here (the CPU build on this platform's disk); the package itself
# only asks for a range, in its optional "torch" extra.
extra=""
[ "${1:-}" = "--test" ] && extra="[test]"
$PY -m pip install -q --disable-pip-version-check "torch==2.13.0" numpy -e ".${extra}" 2>&1 \
  | grep -v -e "is ignored: it is neither a file nor a directory" -e "Running pip as the 'root' user" || true
$PY -c "import openclaw_launch, torch, click, yaml, psutil, pynvml" # fail loudly if the install did not work
# torchft (tests/test_torchft.py: its README line under the launcher, lighthouse and one replica
# group on CPU) and grpcio (openclaw's lighthouse, tests/test_lighthouse.py): the test path only,
# pinned as torch is; about 7 s with torchft's OpenTelemetry deps.
if [ "${1:-}" = "--test" ]; then
  $PY -m pip install -q --disable-pip-version-check "torchft==0.2.0" "grpcio==1.85.4" 2>&1 | grep -v "Running pip as the 'root' user" || true
fi

# The Slurm tests' daemons (tests/test_slurm.py, tests/slurm/start-slurm.sh): as root on Debian,
# slurmctld, slurmd and slurm-client (with munge, which they depend on), installed with a
# policy-rc.d that keeps the packages from starting any daemon. Nothing is configured here: the
# tests write their cluster's configuration into their temporary directory (SLURM_CONF).
if [ "${1:-}" = "--test" ] && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  slurm_missing=()
  for p in slurmctld slurmd slurm-client; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || slurm_missing+=("$p")
  done
  if [ ${#slurm_missing[@]} -gt 0 ]; then
    made_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && made_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${slurm_missing[@]}" >/dev/null 2>&1 \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${slurm_missing[@]}" >/dev/null; } \
      || echo "setup.sh: Slurm (${slurm_missing[*]}) could not be installed; the Slurm tests then fail naming it" >&2
    [ "$made_policy" -eq 0 ] || rm -f /usr/sbin/policy-rc.d
  fi
fi

# The container tests' engine (tests/test_container.py): as root on Debian, podman + runc and the
# cached Debian and torch base images (about 3 minutes the first time, then nothing). A failure
# here does not stop the other checks; the container tests then fail naming it.
if [ "${1:-}" = "--test" ] && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  tests/container/engine.sh install && tests/container/engine.sh base && tests/container/engine.sh base-torch \
    || echo "setup.sh: the container engine or its base images could not be made (see above)" >&2
fi
