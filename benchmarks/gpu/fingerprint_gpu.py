"""The fingerprint on a GPU host (issue 20): the versions the launcher reads without importing torch
(agents/versions.py) against what torch and NVML say once imported, how long each takes, and the
node's NIC choice under ``runtime.nic_binding: nearest``.

Run from the repo root on the GPU host (the ``device`` tool, 1 GPU is enough), about 20 s:
    python3 benchmarks/gpu/fingerprint_gpu.py
Writes $OUT/fingerprint_gpu.txt (the verdict last: ``fingerprint versions: MATCH`` or ``DIFFER``) and
$OUT/fingerprint_gpu.json (``validate --json`` of this host's discovered config with nearest NICs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
OUT = Path(os.environ.get("OUT", "/tmp/openclaw-out"))
OUT.mkdir(parents=True, exist_ok=True)
LINES: list[str] = []


def say(text: str) -> None:
    print(text, flush=True)
    LINES.append(text)


def launcher(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "openclaw_launch", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)


def _or_unset(read: object) -> str:
    """What torch or NVML answer; ``<unset>`` (as the readers say) where they have no answer."""
    try:
        return str(read())  # type: ignore[operator]
    except Exception:  # a CPU torch has no NCCL, a host without a driver no NVML
        return "<unset>"


def _nvml_driver() -> str:
    import pynvml

    pynvml.nvmlInit()
    try:
        return str(pynvml.nvmlSystemGetDriverVersion())
    finally:
        pynvml.nvmlShutdown()


def main() -> int:
    from openclaw_launch.agents.versions import node_versions, python_version_of

    start = time.perf_counter()  # the launcher has its modules loaded: the reading alone
    read = node_versions(Path("/"), lambda: python_version_of(sys.executable))
    read_ms = (time.perf_counter() - start) * 1000
    say(f"read without torch ({read_ms:.1f} ms, torch imported: {'torch' in sys.modules}): {read}")

    start = time.perf_counter()
    import torch

    truth = {"torch": torch.__version__, "torch_cuda": str(torch.version.cuda)}
    truth["nccl"] = _or_unset(lambda: ".".join(map(str, torch.cuda.nccl.version())))
    truth["driver"] = _or_unset(_nvml_driver)
    truth_ms = (time.perf_counter() - start) * 1000
    say(f"torch (+ NVML) imported ({truth_ms:.0f} ms): {truth}")
    differ = {k: (read.get(k), v) for k, v in truth.items() if read.get(k) != v}
    for key, (mine, theirs) in differ.items():
        say(f"  {key}: read {mine!r}, torch/NVML say {theirs!r}")

    config = OUT / "host.yaml"
    found = launcher("discover", "--node-name", "gpuhost", "--ip", "127.0.0.1")
    config.write_text(found.stdout + "runtime:\n  nic_binding: nearest\n")
    checked = launcher("validate", "--config", str(config), "--json")
    (OUT / "fingerprint_gpu.json").write_text(checked.stdout)
    try:
        doc = json.loads(checked.stdout)
    except ValueError:
        say(f"validate --json failed (exit {checked.returncode}): {checked.stderr[-800:]}")
        doc = {}
    fp = doc.get("fingerprint") or {}
    say("fingerprint: " + ", ".join(f"{k} = {v}" for k, v in fp.items() if k.startswith(("version.", "gpu."))))
    for c in doc.get("checks", []):
        if c["name"] == "nic_binding":
            say(f"nic_binding {c['status']}: {c['subject']}: {c['found']} (expected {c['expected']}) {c['message']}")
    plan = launcher("plan", "--config", str(config), "train.py")
    say("plan:\n" + "\n".join(line for line in (plan.stdout + plan.stderr).splitlines() if "nic" in line.lower()))
    say(f"fingerprint versions: {'MATCH' if not differ else 'DIFFER'}")
    (OUT / "fingerprint_gpu.txt").write_text("\n".join(LINES) + "\n")
    return 0 if not differ else 1


if __name__ == "__main__":
    sys.exit(main())
