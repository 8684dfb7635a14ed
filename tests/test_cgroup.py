"""The per-job cgroup v2 (openclaw_launch/run/cgroup.py): found from mountinfo, joined by the workers
before exec, killed by the launcher after each attempt and by the guardian when the launcher is
SIGKILLed; the report says which containment was in force, and without a usable cgroup2 the job
runs as before."""

from __future__ import annotations

import functools
import io
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from guards import GUARD_S, wait_for
from supervise_driver import make_plan
from test_launch_e2e import start, worker
from test_supervise_run import alive, wait_gone
from test_supervise_signals import finish, wait_files

from openclaw_launch.job import launch
from openclaw_launch.report.build import CONTAINMENT
from openclaw_launch.run import cgroup
from openclaw_launch.run.supervise import SuperviseOptions

HYBRID = (
    "25 30 0:23 / /sys rw,nosuid - sysfs sysfs rw\n"
    "35 25 0:30 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n"
    "41 35 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    "42 35 0:39 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
)
PURE_V2 = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
CGROUP1_ONLY = "42 35 0:39 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"


def _usable() -> str | None:
    """Why the real cgroup tests cannot run here, or None."""
    probe = cgroup.create(f"openclaw-probe-{os.getpid()}")
    joinable = probe is not None and probe.joinable()
    if probe is not None:
        probe.remove()
    if not joinable:
        return "no writable cgroup2 hierarchy with cgroup.kill under this process's cgroup (needs root or delegation)"
    return None


WHY_NOT = _usable()
needs_cgroup2 = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")


def test_mountinfo_and_proc_cgroup_give_the_launchers_cgroup_directory() -> None:
    assert cgroup.own_cgroup_dir(HYBRID, "4:memory:/x\n0::/\n") == "/sys/fs/cgroup/unified"
    assert cgroup.own_cgroup_dir(PURE_V2, "0::/system.slice/job.scope\n") == "/sys/fs/cgroup/system.slice/job.scope"
    bind = "50 1 0:26 /slurm/job_7 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"  # a subtree mounted (container)
    assert cgroup.own_cgroup_dir(bind, "0::/slurm/job_7/step_0\n") == "/sys/fs/cgroup/step_0"
    assert cgroup.own_cgroup_dir(bind, "0::/elsewhere\n") is None
    spaced = "50 1 0:26 / /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n"
    assert cgroup.own_cgroup_dir(spaced, "0::/a\n") == "/mnt/cg two/a"
    assert cgroup.own_cgroup_dir(CGROUP1_ONLY, "4:memory:/x\n0::/\n") is None  # no cgroup2 mount
    assert cgroup.own_cgroup_dir(HYBRID, "4:memory:/x\n") is None  # no unified line: cgroup1 only
    assert cgroup.own_cgroup_dir(PURE_V2, "0::/gone (deleted)\n") is None


def test_no_usable_cgroup_means_none_and_nothing_left(tmp_path: Path) -> None:
    plain = tmp_path / "plain"  # writable, but not a cgroup: no cgroup.kill
    plain.mkdir()
    assert cgroup.create("job", root=str(plain)) is None
    assert list(plain.iterdir()) == []
    assert cgroup.create("job", root=str(tmp_path / "missing")) is None
    assert cgroup.create("job", root="/proc/1") is None  # not writable
    (tmp_path / "mountinfo").write_text(CGROUP1_ONLY)
    (tmp_path / "cgroup").write_text("4:memory:/x\n0::/\n")
    assert cgroup.create("job", mountinfo=str(tmp_path / "mountinfo"), proc_cgroup=str(tmp_path / "cgroup")) is None
    assert cgroup.create("job", mountinfo=str(tmp_path / "absent"), proc_cgroup=str(tmp_path / "cgroup")) is None


@needs_cgroup2
def test_clear_kills_a_setsid_grandchild_and_remove_rmdirs() -> None:
    job = cgroup.create(f"openclaw-unit-{os.getpid()}")
    assert job is not None
    try:
        proc = subprocess.Popen(
            ["sh", "-c", "setsid sleep 60 & echo $!; wait"],
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: cgroup.join(job.procs),
        )
        assert proc.stdout is not None
        grandchild = int(proc.stdout.readline())
        assert job.populated() is True
        assert Path(f"/proc/{grandchild}/cgroup").read_text().strip().endswith(os.path.basename(job.path))
        assert job.clear(timeout_s=5.0)
        assert job.populated() is False
        assert proc.wait(timeout=GUARD_S) == -signal.SIGKILL
        wait_gone([grandchild])
    finally:
        assert job.remove()
    assert not os.path.exists(job.path)


def _launch_in_process(tmp_path: Path, args: list[str]) -> dict[str, object]:
    report = tmp_path / "report.json"
    out, err = io.StringIO(), io.StringIO()
    plan = make_plan(1, args, run_id=f"cg-{os.getpid()}")
    code = launch.launch(plan, SuperviseOptions(stdout=out, stderr=err, grace_period_s=1.0), str(report))
    assert code == 0, err.getvalue()
    data: dict[str, object] = json.loads(report.read_text())
    return data


@needs_cgroup2
def test_report_names_the_cgroup_and_it_is_gone_after(tmp_path: Path) -> None:
    report = _launch_in_process(
        tmp_path, ["--grandchildren", "1", "--setsid-grandchildren", "--pids-file", f"{tmp_path}/pids-{{rank}}"]
    )
    containment = str(report["containment"])
    assert containment.startswith("cgroup2:/") and containment.endswith(
        f"/openclaw-cg-{os.getpid()}-{os.getpid()}+{CONTAINMENT}"
    )
    path = containment[len("cgroup2:") : -len(f"+{CONTAINMENT}")]
    assert not os.path.exists(path)
    grandchild = json.loads((tmp_path / "pids-0").read_text())["grandchildren"][0]
    wait_gone([grandchild])


def test_fallback_when_the_cgroup_root_is_not_writable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroup, "create", functools.partial(cgroup.create, root="/proc/1"))
    report = _launch_in_process(tmp_path, ["--stdout", "ok"])
    assert report["containment"] == CONTAINMENT
    assert report["exit_code"] == 0


@needs_cgroup2
def test_setsid_grandchild_of_a_sigkilled_launcher_is_killed_by_the_guardian(tmp_path: Path) -> None:
    proc = start(
        "--nproc-per-node",
        "1",
        "--run-id",
        "cgkill",
        *worker(
            "--grandchildren",
            "1",
            "--setsid-grandchildren",
            "--pids-file",
            f"{tmp_path}/pids-{{rank}}",
            "--ready-file",
            f"{tmp_path}/ready-{{rank}}",
            "--sleep",
            "60",
        ),
    )
    wait_files([tmp_path / "ready-0"], proc)
    grandchild = json.loads((tmp_path / "pids-0").read_text())["grandchildren"][0]
    own = cgroup.own_cgroup_dir(Path("/proc/self/mountinfo").read_text(), Path(f"/proc/{proc.pid}/cgroup").read_text())
    assert own is not None
    job_dir = Path(own) / f"openclaw-cgkill-{proc.pid}"
    assert job_dir.is_dir()
    assert str(grandchild) in (job_dir / "cgroup.procs").read_text().split()
    assert os.getsid(grandchild) == grandchild  # out of the worker's session: no group kill reaches it
    try:
        _sigkill_and_check(proc, grandchild, job_dir)
    finally:  # a failure must not leave the grandchild and the cgroup behind
        cgroup.JobCgroup(str(job_dir)).remove(timeout_s=1.0)


def _sigkill_and_check(proc: subprocess.Popen[str], grandchild: int, job_dir: Path) -> None:
    proc.send_signal(signal.SIGKILL)
    code, _, err = finish(proc)
    assert code == -signal.SIGKILL, err
    wait_gone([grandchild], "the setsid grandchild outlived the SIGKILLed launcher")
    wait_for(lambda: not job_dir.exists(), f"the guardian never removed {job_dir}")
    assert not alive(grandchild)
