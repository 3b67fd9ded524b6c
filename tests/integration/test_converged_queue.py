"""examples/converged_queue.sh start: the queue runs every job, in order, from a frozen copy of the commit it
names, and every row it trains records that commit (a git archive has no history of its own)."""

import shutil
import subprocess
import time

from helpers import ROOT


def test_the_queue_runs_its_jobs_from_the_frozen_commit_it_names(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "examples").mkdir(parents=True)
    shutil.copy2(ROOT / "examples" / "converged_queue.sh", checkout / "examples")
    (checkout / "marker.txt").write_text("committed\n")
    for command in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a"]):
        subprocess.run(["git", "-C", str(checkout), *command], check=True, capture_output=True)
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    (checkout / "marker.txt").write_text("edited after the commit\n")  # the frozen copy must not see it
    calls = tmp_path / "calls.txt"
    python = tmp_path / "python"  # stands in for the interpreter: records what each job ran with
    python.write_text(f'#!/usr/bin/env bash\necho "$PYTHONPATH|$CAPSAGG_CODE_COMMIT|$(cat marker.txt)|$*" >> {calls}\n')
    python.chmod(0o755)
    script = checkout / "examples" / "converged_queue.sh"
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(python), "HOME": str(tmp_path)}
    started = subprocess.run(["bash", str(script), "start", commit], capture_output=True, text=True, env=env,
                             timeout=60)
    assert started.returncode == 0, started.stderr
    log = checkout / "runs" / "converged" / "queue.log"
    deadline = time.time() + 60
    while "every job ran" not in (log.read_text() if log.exists() else "") and time.time() < deadline:
        time.sleep(0.2)
    assert "every job ran, 0 failed" in log.read_text()
    jobs = subprocess.run(["bash", str(script), "jobs"], capture_output=True, text=True, env=env,
                          check=True).stdout.splitlines()
    frozen = checkout / "runs" / f"queue-code-{commit}"
    recorded = [line.split("|") for line in calls.read_text().splitlines()]
    assert [args for _, _, _, args in recorded] == [f"-m fairseq_capsagg.pipeline.table1 {job}" for job in jobs]
    assert {(path, code, marker) for path, code, marker, _ in recorded} == {(str(frozen), commit, "committed")}
    assert (checkout / "runs" / "converged" / "queue.commit").read_text().strip() == commit
