"""The versions a node runs, read without importing torch (the launcher forks its workers, and
importing torch starts threads and costs seconds): torch and the CUDA it was built for from the
text of ``torch/version.py`` (found with ``importlib.util.find_spec``, never executed), NCCL and the
CUDA runtime from the ``nvidia-*`` wheels' metadata (else the version in a bundled ``libnccl.so.X.Y.Z``
name), the driver from ``/proc/driver/nvidia/version`` under the injected host root, the launcher's
package version and the workers' Python.

All of it is read in the launcher's interpreter and its ``sys.path`` (so ``PYTHONPATH`` counts, as
for the workers); only the Python version is asked of ``PYTHON_EXEC`` when that is another one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib import metadata, util
from pathlib import Path

from openclaw_launch.agents.fingerprint import UNSET
from openclaw_launch.single_thread import assert_single_threaded
from openclaw_launch.topology.procfs import read_driver_version

#: The wheels that carry NCCL and the CUDA runtime, newest CUDA first.
NCCL_PACKAGES = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
CUDA_RUNTIME_PACKAGES = ("nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu11")
_ASSIGN_RE = re.compile(r"^(__version__|cuda)\s*(?::[^=]*)?=\s*(?:'([^']*)'|\"([^\"]*)\"|None)\s*$", re.M)
_NCCL_SO_RE = re.compile(r"^libnccl\.so\.(\d+\.\d+\.\d+)$")


def torch_dir() -> Path | None:
    """Where ``import torch`` would load torch from, without loading it."""
    try:
        spec = util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    return Path(locations[0]) if locations else None


def torch_versions(directory: Path | None) -> dict[str, str]:
    """``torch`` and ``torch_cuda`` (the CUDA torch was built for; ``None`` for a CPU build) from
    ``torch/version.py``'s text."""
    found = {"torch": UNSET, "torch_cuda": UNSET}
    try:
        text = (directory / "version.py").read_text() if directory is not None else ""
    except (OSError, UnicodeDecodeError):
        text = ""
    for m in _ASSIGN_RE.finditer(text):
        value = m.group(2) if m.group(2) is not None else m.group(3)
        found["torch" if m.group(1) == "__version__" else "torch_cuda"] = "None" if value is None else value
    return found


def _package_version(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def nccl_version(directory: Path | None) -> str:
    """The ``nvidia-nccl-cu*`` wheel's version, else a bundled ``torch/lib/libnccl.so.X.Y.Z``'s."""
    found = _package_version(NCCL_PACKAGES)
    if found is not None:
        return found
    try:
        names = [p.name for p in (directory / "lib").iterdir()] if directory is not None else []
    except OSError:
        names = []
    bundled = sorted(m.group(1) for n in names if (m := _NCCL_SO_RE.match(n)))
    return bundled[-1] if bundled else UNSET


def node_versions(host_root: Path, python_version: Callable[[], str]) -> dict[str, str]:
    """Every ``version.*`` key of the fingerprint (without the prefix)."""
    directory = torch_dir()
    versions = torch_versions(directory)
    versions["nccl"] = nccl_version(directory)
    versions["cuda_runtime"] = _package_version(CUDA_RUNTIME_PACKAGES) or UNSET
    versions["driver"] = read_driver_version(host_root) or UNSET
    versions["launcher"] = _package_version(("openclaw-launch",)) or UNSET
    versions["python"] = python_version()
    return versions


def python_version_of(python: str) -> str:
    """The workers' Python version: this interpreter's, or asked of ``python`` when it is another."""
    import platform
    import subprocess
    import sys

    if python == sys.executable:
        return platform.python_version()
    assert_single_threaded(f"ask {python} for its version")
    try:
        out = subprocess.run(
            [python, "-c", "import platform; print(platform.python_version())"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return out.stdout.strip() or f"error: {out.stderr.strip()[-200:]}"
    except (OSError, subprocess.SubprocessError) as e:
        return f"error: {e}"
