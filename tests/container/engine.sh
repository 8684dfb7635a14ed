#!/usr/bin/env bash
# A real container engine for the container tests (tests/test_container.py), adapted from the
# podman recipe these machines were checked with: podman + runc, cgroupfs, rlimits below the
# host's (a container may not raise them here), no image registry (the Debian base is made by
# debootstrap from Debian's packages, then cached as an image). Unlike the recipe it uses overlay
# storage in a root of its own (/var/lib/containers/openclaw): with vfs every container is a full
# copy of its image (28 s to create one from the 295 MB base, 44 s with torch; overlay: 0.1 s).
#
#   engine.sh install        podman, runc, debootstrap from Debian's packages when missing (root,
#                            Debian/Ubuntu only; idempotent; exit 3 and one line when it cannot)
#   engine.sh base [IMAGE]   the cached base (default openclaw-base:bookworm): bookworm + python3,
#                            pip, numactl, procps. First time about 3-4 minutes, then "exists".
#   engine.sh base-torch     the cached stand-in for an operators' PyTorch image: the base + the CPU
#                            torch 2.13.0 wheel (about 1m45 once; building torch into the test image
#                            on every run instead would cost that much on every CI run).
#   engine.sh podman ARGS... podman with this engine's storage and runtime flags
#   engine.sh pipconf DIR    DIR/pip.conf for `pip install` inside a build (this machine's index,
#                            wheel directory, certificate and constraints); prints the -v mounts.
#
# Environment: OPENCLAW_BASE_TIMEOUT_S (debootstrap + import, default 900).
set -euo pipefail
PODMAN=(podman --root /var/lib/containers/openclaw --runroot /run/openclaw-containers --storage-driver overlay
        --runtime runc --cgroup-manager cgroupfs)

LIMITS="--ulimit nofile=10000:10000 --ulimit nproc=30000:30000"  # also in tests/test_container.py

have_engine() { command -v podman >/dev/null && command -v runc >/dev/null && command -v debootstrap >/dev/null; }

cmd_install() {
  have_engine && return 0
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "container engine: podman/runc/debootstrap missing and not root on Debian; container tests will skip" >&2
    exit 3
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap >/dev/null
}

unmount_under() {
  local m
  for m in $(awk -v r="$1/" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r); do umount -l "$m" || true; done
}

cmd_base() {
  local image=${1:-openclaw-base:bookworm}
  "${PODMAN[@]}" image exists "$image" && return 0
  local log
  ROOTFS=$(mktemp -d /tmp/openclaw-rootfs.XXXXXX)
  local root=$ROOTFS
  log=$(mktemp /tmp/openclaw-debootstrap.XXXXXX.log)
  trap 'unmount_under "$ROOTFS"; rm -rf --one-file-system "$ROOTFS"' EXIT
  echo "building the container tests' Debian base $image by debootstrap (about 3-4 minutes, once)" >&2
  if ! timeout "${OPENCLAW_BASE_TIMEOUT_S:-900}" debootstrap --variant=minbase \
      --include=python3,python3-pip,numactl,procps bookworm "$root" >"$log" 2>&1; then
    echo "debootstrap of the base $image failed or timed out (log $log):" >&2
    tail -n 5 "$log" >&2
    exit 1
  fi
  unmount_under "$root"  # debootstrap can leave the target's /proc mounted: never pack the host's
  # PIP_BREAK_SYSTEM_PACKAGES is NOT set in the base: the Dockerfile must cope with PEP 668 itself.
  tar -C "$root" --one-file-system -c . | timeout 600 "${PODMAN[@]}" import - "$image" >/dev/null
  rm -f "$log"
}

cmd_base_torch() {
  local image=openclaw-base:bookworm-torch dir
  "${PODMAN[@]}" image exists "$image" && return 0
  cmd_base openclaw-base:bookworm
  dir=$(mktemp -d /tmp/openclaw-torch.XXXXXX)
  printf '%s\n' "FROM openclaw-base:bookworm" \
    "RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir torch==2.13.0 numpy" >"$dir/Containerfile"
  echo "building the container tests' torch base $image (about 2 minutes, once)" >&2
  # shellcheck disable=SC2046
  if ! timeout 900 "${PODMAN[@]}" build --layers=false --network host $LIMITS $(cmd_pipconf "$dir/pip") \
      -t "$image" "$dir" >"$dir/log" 2>&1; then
    echo "building $image failed or timed out:" >&2
    tail -n 5 "$dir/log" >&2
    rm -rf "$dir"
    exit 1
  fi
  rm -rf "$dir"
}

cmd_pipconf() {
  local dir=$1 key value mounts=""
  mkdir -p "$dir"
  {
    echo "[global]"
    # Every setting of this machine's pip (files, env), as pip itself sees it: `scope.key='value'`.
    pip config list 2>/dev/null | sed -n "s/^[^.]*\.\([a-z-]*\)='\(.*\)'$/\1 \2/p" | sort -u -k1,1 |
      while read -r key value; do
        case $key in index-url|extra-index-url|find-links|cert|constraint|trusted-host|default-timeout)
          echo "$key = $value" ;;
        esac
      done
  } >"$dir/pip.conf"
  # The local paths those settings name, mounted read-only at the same place.
  for value in $(sed -n 's/^[a-z-]* = //p' "$dir/pip.conf"); do
    case $value in file://*/simple) value=${value#file://}; value=${value%/simple} ;; esac  # + its files/
    case $value in /*) ;; *) continue ;; esac
    [ -e "$value" ] || value=$(dirname "$value")
    case $value in /|/etc|/usr|/opt|/root) continue ;; esac
    [ -e "$value" ] && mounts="$mounts -v $value:$value:ro"
  done
  echo "-v $dir/pip.conf:/etc/pip.conf:ro$mounts"
}

case ${1:-} in
  install) cmd_install ;;
  base) shift; cmd_base "$@" ;;
  base-torch) cmd_base_torch ;;
  pipconf) shift; cmd_pipconf "$@" ;;
  podman) shift; exec "${PODMAN[@]}" "$@" ;;
  *) sed -n '2,16p' "$0"; exit 2 ;;
esac
