"""examples/converged_queue.sh start: the queue runs every job, in order, from a frozen copy of the commit it
names, and every row it trains records that commit (a git archive has no history of its own); on a machine
that lost runs/ it says so before training from the first row again."""

import shlex
import shutil
import subprocess
import time
from pathlib import Path

from helpers import ROOT


def published_folder(script):
    """The folder the queue's En->De jobs publish to (its ``--publish``), relative to the checkout."""
    jobs = subprocess.run(["bash", str(script), "jobs"], capture_output=True, text=True, check=True).stdout
    first = shlex.split(jobs.splitlines()[0])
    return Path(first[first.index("--publish") + 1]).relative_to(script.resolve().parents[1])


def queue_checkout(tmp_path, published_run=False):
    """A git checkout holding the queue's script (and, with ``published_run``, a table published by its run),
    and an environment whose interpreter only records what each job ran with; returns the script, the
    commit, the environment and the file of recorded calls."""
    checkout = tmp_path / "checkout"
    (checkout / "examples").mkdir(parents=True)
    shutil.copy2(ROOT / "examples" / "converged_queue.sh", checkout / "examples")
    (checkout / "marker.txt").write_text("committed\n")
    if published_run:
        folder = checkout / published_folder(ROOT / "examples" / "converged_queue.sh")
        folder.mkdir(parents=True)
        (folder / "converged-cpu.json").write_text('{"results": {}}')
    for command in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a"]):
        subprocess.run(["git", "-C", str(checkout), *command], check=True, capture_output=True)
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    (checkout / "marker.txt").write_text("edited after the commit\n")  # the frozen copy must not see it
    calls = tmp_path / "calls.txt"
    python = tmp_path / "python"
    python.write_text(f'#!/usr/bin/env bash\necho "$PYTHONPATH|$CAPSAGG_CODE_COMMIT|$(cat marker.txt)|$*" >> {calls}\n')
    python.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(python), "HOME": str(tmp_path)}
    return checkout / "examples" / "converged_queue.sh", commit, env, calls


def start_and_wait(script, commit, env):
    """``start COMMIT``, then the queue's log once every job has run (the stand-in interpreter returns at once)."""
    started = subprocess.run(["bash", str(script), "start", commit], capture_output=True, text=True, env=env,
                             timeout=60)
    assert started.returncode == 0, started.stderr
    log = script.parents[1] / "runs" / "converged" / "queue.log"
    deadline = time.time() + 60
    while "every job ran" not in (log.read_text() if log.exists() else "") and time.time() < deadline:
        time.sleep(0.2)
    return started, log.read_text()


def test_the_queue_runs_its_jobs_from_the_frozen_commit_it_names(tmp_path):
    script, commit, env, calls = queue_checkout(tmp_path)
    started, log = start_and_wait(script, commit, env)
    assert "every job ran, 0 failed" in log and "warning" not in started.stderr
    jobs = subprocess.run(["bash", str(script), "jobs"], capture_output=True, text=True, env=env,
                          check=True).stdout.splitlines()
    runs = script.parents[1] / "runs"
    recorded = [line.split("|") for line in calls.read_text().splitlines()]
    assert [args for _, _, _, args in recorded] == [f"-m fairseq_capsagg.pipeline.table1 {job}" for job in jobs]
    assert {(path, code, marker) for path, code, marker, _ in recorded} == {
        (str(runs / f"queue-code-{commit}"), commit, "committed")}
    assert (runs / "converged" / "queue.commit").read_text().strip() == commit


def test_a_queue_started_without_its_runs_beside_a_published_run_says_so(tmp_path):
    """A new machine: runs/ is empty while the run's table holds scored rows. The queue still starts (its
    reports cannot replace those rows), and one warning says what happened and what to do."""
    script, commit, env, _ = queue_checkout(tmp_path, published_run=True)
    started, log = start_and_wait(script, commit, env)
    assert "every job ran, 0 failed" in log
    assert started.stderr.count("warning: ") == 1 and "a new machine (runs/ lost)?" in started.stderr


def test_the_status_compares_the_rows_in_training_with_every_earlier_run(tmp_path):
    """``status`` asks for each work directory's progress, the En->De one against every earlier run's published
    table, oldest first (whether this run trains the same network again), not its own; the Zh->En one alone."""
    script, _, env, calls = queue_checkout(tmp_path, published_run=True)
    root = script.parents[1]
    results = root / "docs" / "results"
    (results / "converged-run2").mkdir()
    for table in (results / "converged-cpu.json", results / "converged-run2" / "converged-cpu.json"):
        table.write_text('{"results": {}}')
    runs = root / "runs"
    for work in ("converged", "converged-zhen"):
        (runs / work).mkdir(parents=True)
        (runs / work / "config.json").write_text("{}")
    subprocess.run(["bash", str(script), "status"], capture_output=True, text=True, env=env, timeout=60)
    assert published_folder(script) not in (Path("docs/results"), Path("docs/results/converged-run2"))
    assert [line.split("|")[-1] for line in calls.read_text().splitlines()] == [
        f"-m fairseq_capsagg.pipeline.progress {runs / 'converged'} --against {results / 'converged-cpu.json'} "
        f"--against {results / 'converged-run2' / 'converged-cpu.json'}",
        f"-m fairseq_capsagg.pipeline.progress {runs / 'converged-zhen'}"]


def test_a_queue_started_on_a_new_machine_resumes_from_the_carried_state(tmp_path):
    """runs/ lost, carry/converged.tar.xz committed: ``start`` restores it into the work directory before the
    first job, and ``carry`` (the queue not running) writes it from there."""
    script, commit, env, calls = queue_checkout(tmp_path)
    root = script.parents[1]
    archive, work = root / "carry" / "converged.tar.xz", root / "runs" / "converged"
    archive.parent.mkdir()
    archive.write_bytes(b"")
    start_and_wait(script, commit, env)
    recorded = [line.split("|")[-1] for line in calls.read_text().splitlines()]
    assert recorded[0] == f"-m fairseq_capsagg.pipeline.carry restore {archive} {work}"
    assert recorded[1].startswith("-m fairseq_capsagg.pipeline.table1 ")
    pid = int((work / "queue.pid").read_text())
    while subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode == 0:  # the queue's last echo
        time.sleep(0.1)
    subprocess.run(["bash", str(script), "carry"], capture_output=True, text=True, env=env, timeout=60, check=True)
    assert calls.read_text().splitlines()[-1].split("|")[-1] == \
        f"-m fairseq_capsagg.pipeline.carry save {work} {archive}"
