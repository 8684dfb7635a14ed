"""Throughput of the same GPU jobs under torchrun and openclaw-launch, interleaved, as ratios.

Usage (on the GPU host, from the repo root):
  python3 benchmarks/gpu/compare.py --config-dir DIR --reps 2 --json OUT.json
DIR holds ordered.yaml, isolated.yaml, ordered-mps.yaml, isolated-mps.yaml (bench_gpu.sh writes them).
torchrun's MPS variants run under a private MPS daemon started with openclaw_launch.run.mps.daemon.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = {"allreduce": HERE / "allreduce.py", "ddp": HERE / "ddp_train.py"}
TAGS = {"allreduce": "ALLREDUCE ", "ddp": "DDP "}


def run_once(argv: list[str], env: dict[str, str], tag: str, timeout_s: float) -> dict[str, float]:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
    for line in proc.stdout.splitlines():  # the line may carry a "[rank 0] " prefix
        if tag in line:
            return dict(json.loads(line.split(tag, 1)[1]))
    raise RuntimeError(f"{argv} rc={proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config-dir", required=True)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--json", required=True)
    p.add_argument("--timeout-s", type=float, default=120)
    p.add_argument("--scripts", default=",".join(SCRIPTS), help="comma list of: " + ", ".join(SCRIPTS))
    args = p.parse_args()
    from openclaw_launch.plan.env import mps_client_env
    from openclaw_launch.plan.model import MpsPlan
    from openclaw_launch.run.mps.daemon import MpsDaemon

    torchrun_mps = MpsPlan(None, None, None, on_start_failure="error", gpu_uuids=())

    cfg = Path(args.config_dir)
    py = sys.executable
    base = dict(os.environ)
    launcher = [py, "-m", "openclaw_launch"]
    variants = {
        "torchrun": (["torchrun", "--standalone", "--nproc-per-node", "2"], False),
        "openclaw-ordered": ([*launcher, "--config", str(cfg / "ordered.yaml")], False),
        "openclaw-isolated": ([*launcher, "--config", str(cfg / "isolated.yaml")], False),
        "torchrun-mps": (["torchrun", "--standalone", "--nproc-per-node", "2"], True),
        "openclaw-ordered-mps": ([*launcher, "--config", str(cfg / "ordered-mps.yaml")], False),
        "openclaw-isolated-mps": ([*launcher, "--config", str(cfg / "isolated-mps.yaml")], False),
    }
    samples: dict[str, dict[str, list[dict[str, float]]]] = {}
    for rep in range(args.reps):
        for script in args.scripts.split(","):
            path = SCRIPTS[script]
            for name, (prefix, needs_mps) in variants.items():
                env = dict(base)
                daemon = None
                if needs_mps:
                    daemon = MpsDaemon(torchrun_mps, run_dir=Path(tempfile.mkdtemp(prefix="bench-mps-")) / "mps")
                    daemon.start()
                    env.update(mps_client_env(daemon.pipe_dir, daemon.log_dir))
                try:
                    out = run_once([*prefix, str(path)], env, TAGS[script], args.timeout_s)
                except (RuntimeError, subprocess.TimeoutExpired) as e:  # keep the other variants' numbers
                    print(f"rep {rep} {script} {name} FAILED: {e}", flush=True)
                    continue
                finally:
                    if daemon is not None:
                        daemon.stop()
                samples.setdefault(script, {}).setdefault(name, []).append(out)
                print(f"rep {rep} {script:9s} {name:22s} {json.dumps(out)}", flush=True)

    summary: dict[str, dict[str, dict[str, float]]] = {}
    for script, by_variant in samples.items():
        for name, outs in by_variant.items():
            keys = outs[0].keys()
            summary.setdefault(script, {})[name] = {k: statistics.median(o[k] for o in outs) for k in keys}
    ratios: dict[str, dict[str, float]] = {}
    for script, by_variant in summary.items():
        metric = "samples_per_s" if script == "ddp" else str(1 << 30)
        for name, med in by_variant.items():
            ref = by_variant.get("torchrun-mps" if name.endswith("-mps") else "torchrun")
            if ref is None:
                continue
            ratios.setdefault(script, {})[name] = round(med[metric] / ref[metric], 4)
    Path(args.json).write_text(
        json.dumps({"samples": samples, "median": summary, "ratio_vs_torchrun": ratios}, indent=2)
    )
    print(json.dumps({"median": summary, "ratio_vs_torchrun": ratios}, indent=2))


if __name__ == "__main__":
    main()
