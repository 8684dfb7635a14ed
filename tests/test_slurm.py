"""Slurm places the launchers: real slurmctld + 2 slurmd on this host (tests/slurm/start-slurm.sh,
the project's tested single-host recipe), one `openclaw-launch` per Slurm node via srun/sbatch,
node identity from SLURM_NODEID, and scancel leaves no worker behind.

The cluster lives in the tests' temporary directory (its slurm.conf named by SLURM_CONF in every
command's environment) and leaves the machine as it found it: no file under /etc/slurm, no daemon
left running (checked when the module's cluster stops). scripts/setup.sh --test installs Slurm."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from guards import GUARD_S, wait_for
from host import free_port
from test_supervise_run import recorded_pids, wait_gone

ROOT = Path(__file__).resolve().parent.parent
SLURM = ROOT / "tests" / "slurm"
CLUSTER = {"NODES": "2", "CTLD_PORT": "16917", "NODE_BASE_PORT": "17100"}
SLURM_DAEMONS = {"slurmctld", "slurmd", "slurmstepd"}
ETC_SLURM = Path("/etc/slurm")
LAUNCH = [sys.executable, "-m", "openclaw_launch", "--config", "configs/two-nodes-loopback.yaml"]

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("apt-get") is None, reason="the Slurm recipe needs root on Debian"
    ),
    pytest.mark.serial,  # host-wide: fixed daemon ports, and the check that no Slurm daemon is left counts them all
]


def slurm_daemon_pids() -> set[int]:
    """Every running Slurm daemon or step daemon of this host, ours or not."""
    return {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] in SLURM_DAEMONS}


def etc_slurm_listing() -> dict[str, tuple[int, int, int]]:
    """/etc/slurm as (mode, size, mtime_ns) per path: equal before and after means untouched."""
    listing: dict[str, tuple[int, int, int]] = {}
    for path in [ETC_SLURM, *ETC_SLURM.rglob("*")] if ETC_SLURM.exists() else []:
        st = path.lstat()
        listing[str(path)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return listing


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A running two-node cluster in a temporary directory; yields the environment for its commands."""
    run_dir = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, **CLUSTER, "RUN_DIR": str(run_dir), "SLURM_CONF": str(run_dir / "etc" / "slurm.conf")}
    daemons_before, etc_before = slurm_daemon_pids(), etc_slurm_listing()
    started = subprocess.run(["bash", str(SLURM / "start-slurm.sh")], env=env, capture_output=True, text=True)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        yield env
    finally:
        subprocess.run(["bash", str(SLURM / "stop-slurm.sh")], env=env, capture_output=True, timeout=GUARD_S)
        wait_gone(sorted(slurm_daemon_pids() - daemons_before), "a Slurm daemon of ours is left")
        assert etc_slurm_listing() == etc_before, "the Slurm tests changed /etc/slurm"


def test_srun_starts_one_launcher_per_node_and_they_form_one_world(slurm: dict[str, str]) -> None:
    out = subprocess.run(
        ["srun", "--immediate=30", "--kill-on-bad-exit=1", "-l", "-N2", "--ntasks-per-node=1", *LAUNCH]
        + ["--master-port", str(free_port())]
        + ["tests/allreduce_worker.py"],
        cwd=ROOT,
        env=slurm,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = set(out.stdout.splitlines())
    assert "0: [rank 0] rank 0/3 local 0 sum 3" in lines  # Slurm node 0 -> config node0: ranks 0, 1
    assert "0: [rank 1] rank 1/3 local 1 sum 3" in lines
    assert "1: [rank 2] rank 2/3 local 0 sum 3" in lines  # Slurm node 1 -> config node1: rank 2


def test_srun_torchrun_recipe_c10d_without_node_rank_ranks_the_nodes_by_arrival(
    slurm: dict[str, str], tmp_path: Path
) -> None:
    """The common recipe, `srun torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d
    --rdzv-endpoint HEAD:PORT train.py`, with openclaw-launch for torchrun: one launcher per Slurm
    node, no config and no node rank. The rendezvous gives the node ranks (HEAD's launcher is 0;
    both slurmd of the test cluster are this host, 127.0.0.1), one world of 4 ranks forms."""
    line = ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d"]
    line += ["--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--report", f"{tmp_path}/report-$SLURM_NODEID.json"]
    launcher = " ".join([sys.executable, "-m", "openclaw_launch", *line, "tests/allreduce_worker.py"])
    out = subprocess.run(
        ["srun", "--immediate=30", "-N2", "--ntasks-per-node=1", "bash", "-c", f"exec {launcher}"],
        cwd=ROOT,
        env=slurm,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = set(out.stdout.splitlines())
    assert {f"[rank {r}] rank {r}/4 local {r % 2} sum 6" for r in range(4)} <= lines, out.stdout
    assert "node rank 0 of 2 (by arrival" in out.stderr and "node rank 1 of 2 (by arrival" in out.stderr
    reports = [json.loads((tmp_path / f"report-{n}.json").read_text()) for n in (0, 1)]
    assert sorted(r["node"] for r in reports) == ["node0", "node1"]
    job = next(tmp_path.glob("report-*-job.json"))  # written by node rank 0, whichever Slurm node it is
    assert [(r["rank"], r["node"]) for r in json.loads(job.read_text())["ranks"]] == [
        (0, "node0"),
        (1, "node0"),
        (2, "node1"),
        (3, "node1"),
    ]


def test_sbatch_script(slurm: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n#SBATCH -N2 --ntasks-per-node=1\n"
        f"cd {ROOT}\n"  # $SLURM_NODEID must be expanded per task, not once by the batch shell
        f"srun bash -c 'exec {' '.join(LAUNCH)} --master-port {free_port()} "
        f"--report {tmp_path}/report-$SLURM_NODEID.json tests/allreduce_worker.py'\n"
    )
    out = tmp_path / "job.out"
    done = subprocess.run(
        ["sbatch", "--wait", "-o", str(out), str(script)], env=slurm, capture_output=True, text=True, timeout=GUARD_S
    )
    assert done.returncode == 0, done.stdout + done.stderr + (out.read_text() if out.exists() else "")
    assert "[rank 2] rank 2/3 local 0 sum 3" in out.read_text()
    job_id = done.stdout.split()[-1]  # "Submitted batch job N"
    reports = [json.loads((tmp_path / f"report-{n}.json").read_text()) for n in (0, 1)]
    assert [r["node"] for r in reports] == ["node0", "node1"]
    assert {r["run_id"] for r in reports} == {job_id}  # one run id for the job, from SLURM_JOB_ID
    job = json.loads((tmp_path / "report-0-job.json").read_text())  # one report, on the first node
    assert [(r["rank"], r["node"]) for r in job["ranks"]] == [(0, "node0"), (1, "node0"), (2, "node1")]
    assert not (tmp_path / "report-1-job.json").exists()
    assert out.read_text().count("job report (every node):") == 1


def test_scancel_usr1_reaches_every_worker_and_the_job_goes_on(slurm: dict[str, str], tmp_path: Path) -> None:
    worker = [sys.executable, str(ROOT / "tests" / "fake_worker.py"), "--log-signals", f"{tmp_path}/sig-{{rank}}"]
    worker += ["--survive-usr", "--ready-file", f"{tmp_path}/ready-{{rank}}", "--sleep", "6"]
    job = subprocess.Popen(
        ["srun", "-N2", "--ntasks-per-node=1", "-J", "openclaw-usr1", *LAUNCH, "--master-port", str(free_port())]
        + ["--no-python", "--", *worker],
        cwd=ROOT,
        env=slurm,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_ready(tmp_path, job)
    subprocess.run(["scancel", "--signal=USR1", "-n", "openclaw-usr1"], env=slurm, check=True, timeout=GUARD_S)
    out, err = job.communicate(timeout=GUARD_S)
    assert job.returncode == 0, out + err  # checkpoint requested, training went on to its end
    # Slurm signals every process of the step (proctrack), and the launcher forwards it too: a
    # worker sees SIGUSR1 once or twice (two pending alike signals merge), and nothing else.
    for r in range(3):
        assert set((tmp_path / f"sig-{r}").read_text().split()) == {"SIGUSR1"}


def test_scancel_stops_the_launchers_and_leaves_no_worker(slurm: dict[str, str], tmp_path: Path) -> None:
    worker = [
        sys.executable,
        str(ROOT / "tests" / "fake_worker.py"),
        "--pids-file",
        f"{tmp_path}/pids-{{rank}}",
        "--grandchildren",
        "1",
        "--ready-file",
        f"{tmp_path}/ready-{{rank}}",
        "--sleep",
        "120",
    ]
    job = subprocess.Popen(
        [
            "srun",
            "-N2",
            "--ntasks-per-node=1",
            "-J",
            "openclaw-scancel",
            *LAUNCH,
            "--grace-period-s",
            "1",
            "--no-python",
            "--",
            *worker,
        ],
        cwd=ROOT,
        env=slurm,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_ready(tmp_path, job)
    subprocess.run(["scancel", "-n", "openclaw-scancel"], env=slurm, check=True, timeout=GUARD_S)
    job.communicate(timeout=GUARD_S)
    pids = recorded_pids(tmp_path)
    assert len(pids) == 6
    wait_gone(pids)


def test_example_sbatch_script_forwards_the_batch_usr1_and_the_job_goes_on(
    slurm: dict[str, str], tmp_path: Path
) -> None:
    """examples/slurm-job.sh as submitted, SIGUSR1 to its batch shell only (what --signal=B:USR1@90
    does at the time limit): every worker sees it, none stops, the job ends 0."""
    worker = f"{sys.executable} {ROOT}/tests/fake_worker.py --log-signals {tmp_path}/sig-{{rank}} --survive-usr "
    worker += f"--ready-file {tmp_path}/ready-{{rank}} --sleep 6"
    env = {
        **slurm,
        "CONFIG": "configs/two-nodes-loopback.yaml",
        "TRAIN": f"--master-port {free_port()} --no-python -- {worker}",
        "REQUEUE": "0",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    submitted = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-o",
            str(tmp_path / "job.out"),
            "-D",
            str(ROOT),
            str(ROOT / "examples" / "slurm-job.sh"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    wait_for(
        lambda: all((tmp_path / f"ready-{r}").exists() for r in range(3)),
        lambda: f"workers never started: {(tmp_path / 'job.out').read_text()}",
        poll_s=0.1,
    )
    subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], env=slurm, check=True, timeout=GUARD_S)

    def ended() -> bool:
        queued = subprocess.run(
            ["squeue", "-h", "-j", job_id], env=slurm, capture_output=True, text=True, timeout=GUARD_S
        )
        return not queued.stdout.strip()

    wait_for(ended, "the job never ended", poll_s=0.2)
    shown = subprocess.run(["scontrol", "show", "job", job_id], env=slurm, capture_output=True, text=True).stdout
    assert "ExitCode=0:0" in shown and "JobState=COMPLETED" in shown, shown + (tmp_path / "job.out").read_text()
    for r in range(3):
        assert set((tmp_path / f"sig-{r}").read_text().split()) == {"SIGUSR1"}


def _wait_ready(tmp_path: Path, job: subprocess.Popen[str], ranks: int = 3) -> None:
    """Every rank of the srun job wrote its ready file (the job still running)."""

    def ready() -> bool:
        assert job.poll() is None, "the srun job ended before its workers started"
        return all((tmp_path / f"ready-{r}").exists() for r in range(ranks))

    wait_for(ready, "workers never started", poll_s=0.1)
