"""The converged comparison (capsagg-table1 --table converged, --quick): rows trained to the resumable
stop rule in segments, continued rows from the converged best checkpoint, the published table and curves."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from fairseq_capsagg.pipeline import reference_pack, snapshot, stage_names
from fairseq_capsagg.pipeline.experiment import QUICK
from helpers import ROOT, table1
from published import converged_table


CONVERGED_ROWS = "converged-baseline-s1,continued-baseline"
LENPEN = ("--lenpen-grid", "2,1")  # as the queue scores its rows, on a grid that keeps the quick run quick


@pytest.fixture(scope="module")
def quick_converged(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("converged")
    publish = tmp_path_factory.mktemp("published")
    result = table1("--quick", "--table", "converged", "--workdir", str(workdir), "--rows", CONVERGED_ROWS,
                    "--publish", str(publish), *LENPEN)
    return workdir, publish, result


def test_converged_rows_train_until_the_rule_stops_them_in_resumable_segments(quick_converged):
    workdir, publish, _ = quick_converged
    payload = json.loads((publish / "converged-cpu.json").read_text())
    results = payload["results"]
    assert set(results) == set(CONVERGED_ROWS.split(","))
    base = results["converged-baseline-s1"]
    # --quick: validation every 5 updates, patience 10, cap 20; each segment ends at best + patience
    interval, patience, cap = QUICK["validate_interval_updates"], QUICK["patience_updates"], QUICK["update_cap"]
    segments = sorted(int(p.stem.split("-")[1]) for p in (workdir / "logs" / "train-converged-baseline-s1").glob("*.log"))
    assert segments[0] == 0 and len(segments) >= 2 and all(s % interval == 0 for s in segments)
    assert base["stopped_at"] in (base["best_update"] + patience, cap)
    assert base["converged"] == (base["best_update"] + patience <= base["stopped_at"])
    assert [p["update"] for p in base["curve"]] == list(range(interval, base["stopped_at"] + 1, interval))
    assert base["best_loss"] == pytest.approx(min(p["loss"] for p in base["curve"]), abs=5e-4)
    assert base["idle_updates_per_s"] > 0 and base["load_average"] > 0 and base["grad_norm"] > 0
    averaged = range(max(interval, base["stopped_at"] - 4 * interval), base["stopped_at"] + 1, interval)
    assert base["average"]["updates"] == list(averaged)


def test_continued_rows_start_from_the_converged_best_checkpoint_at_its_learning_rate(quick_converged):
    workdir, publish, _ = quick_converged
    results = json.loads((publish / "converged-cpu.json").read_text())["results"]
    row, base = results["continued-baseline"], results["converged-baseline-s1"]
    assert row["stopped_at"] == QUICK["warm_updates"]
    assert row["lr"] == pytest.approx(2e-3 * (QUICK["warmup"] / base["best_update"]) ** 0.5)
    log = (workdir / "logs" / "train-continued-baseline" / "from-0.log").read_text()
    assert f"loading pretrained model from {workdir}/checkpoints/converged-baseline-s1/checkpoint_best.pt" in log
    assert "'lr_scheduler': {'_name': 'fixed', " in log and f"'warmup_updates': {QUICK['warmup']}, " in log
    assert row["reference"] == "converged-baseline-s1" and 0 <= row["bootstrap_p"] <= 1 and row["delta_params"] == 0
    assert row["delta_bleu"] == pytest.approx(row["bleu"] - base["bleu"], abs=0.01)
    assert row["average"]["delta_bleu"] == pytest.approx(row["average"]["bleu"] - base["average"]["bleu"], abs=0.01)
    assert row["references"]["sentences"] == 60 and 0 <= row["references"]["search_error_share"] <= 1
    assert row["untranslated_ids"] == [] == base["untranslated_ids"]  # every test sentence decoded
    for tuned in (row["tuned"], base["tuned"]):  # each row's length penalty tuned on validation, on its own
        assert tuned["lenpen"] in (1.0, 2.0) and set(tuned["valid_bleu"]) == {"1", "2"}
    assert row["tuned"]["delta_bleu"] == pytest.approx(row["tuned"]["bleu"] - base["tuned"]["bleu"], abs=0.01)
    assert 0 <= row["tuned"]["bootstrap_p"] <= 1


def test_the_continued_systems_start_where_the_converged_transformer_is(quick_converged):
    """Step 0 of every continued system from the converged best checkpoint: the routing families with their
    identity start and ramp, and the dense connections, at the Transformer's own validation loss: the one
    fairseq logged for that checkpoint (the same sentences validated, rounded to 3 decimals there)."""
    workdir, publish, _ = quick_converged
    payload = json.loads((publish / "converged-cpu.json").read_text())
    step0 = payload["continued_step0"]
    assert step0["baseline"]["loss"] == pytest.approx(payload["results"]["converged-baseline-s1"]["best_loss"], abs=6e-4)
    assert {"baseline", "transformer_emrouting_small (identity + ramp)", "transformer_mudd_small",
            "transformer_dwa_small", "transformer_dyncomb_small"} <= set(step0)
    for start in ("transformer_emrouting_small (identity + ramp)", "transformer_mudd_small", "transformer_dwa_small",
                  "transformer_hc_small", "transformer_mhc_small"):
        assert step0[start]["loss"] == pytest.approx(step0["baseline"]["loss"], abs=1e-4), start
    assert "at step 0 of a warm start from `converged-baseline-s1`'s best checkpoint" in (
        publish / "converged-cpu.md").read_text()


def test_the_converged_table_lists_pending_rows_and_publishes_its_curves(quick_converged, tmp_path):
    workdir, publish, _ = quick_converged
    table = (publish / "converged-cpu.md").read_text()
    for pending in ("| converged-dyncomb-s1 | + Dynamic Combination | 1 | pending |",
                    "| continued-emrouting-encoder | + EM Routing (--decoder-aggregation none) | 1 | pending |",
                    "| continued-emrouting | + EM Routing | 1 | pending |",
                    "| converged-baseline-s2 | Transformer | 2 | pending |",
                    "| converged-mudd-s1 | + MUDD connections | 1 | pending |"):
        assert pending in table
    assert "### Compute equivalence" in table and "### Model error or search error" in table
    assert ("### Length penalty tuned on the validation split, each row on its own, from its best checkpoint "
            "(`--lenpen` from 1, 2; against the row named in its protocol's title, also tuned)") in table
    assert converged_table(json.loads((publish / "converged-cpu.json").read_text())) == table  # the JSON holds it all
    assert (publish / "converged-curves.png").stat().st_size > 10_000
    again = table1("--quick", "--table", "converged", "--workdir", str(workdir), "--rows", CONVERGED_ROWS,
                   "--publish", str(tmp_path), *LENPEN)
    assert "[main-job] train continued-baseline ..." not in again.stdout
    assert (tmp_path / "converged-cpu.md").read_text() == table


def test_a_converged_rule_off_the_validation_grid_is_one_clear_line(tmp_path):
    result = table1("--table", "converged", "--workdir", str(tmp_path / "w"), "--patience-updates", "1234", check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "error: --validate-interval-updates 500, --patience-updates 1234" in result.stderr


def gpu_command_env(tmp_path):
    """The GPU commands' environment for a run on this CPU: their outputs in ``tmp_path``, and no wheels or
    converged-Transformer pack of this checkout (.whl, .gpu-reference, made for the GPU) picked up."""
    return dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path / "out"), WORK=str(tmp_path / "work"),
                WHEELS_DIR=str(tmp_path / "no-wheels"), PACK=str(tmp_path / "no-pack"))


def test_the_gpu_command_names_its_rows_and_flags_rightly(tmp_path):
    """examples/converged_gpu.sh run, with --quick on this CPU and training nothing: its flags parse and its
    rows exist (the GPU run itself needs a device)."""
    env = gpu_command_env(tmp_path)
    result = subprocess.run(["bash", str(ROOT / "examples" / "converged_gpu.sh"), "run", "--quick", "--report-only"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    table = (tmp_path / "out" / "converged-cpu.md").read_text()
    for row in ("converged-baseline-s1", "continued-baseline", "continued-emrouting", "continued-dyncomb",
                "continued-mudd"):
        assert re.search(rf"\| {row} \| [^|]+ \| \d \| pending \|", table), row  # listed, nothing trained
    assert "Validation every 5 updates on the validation split as fairseq validates it" in table  # --quick's rule


@pytest.mark.parametrize("script", ["converged_gpu.sh", "gpu_session.sh"])
def test_the_gpu_scripts_run_here_with_the_checkouts_venv_and_elsewhere_with_python3(script, tmp_path):
    """Without PYTHON the GPU scripts take the checkout's .venv where it has one (here, where the system Python
    has no torch) and python3 where it has none (the GPU machine, which is never sent a .venv)."""
    checkout = tmp_path / "checkout"
    (checkout / "examples").mkdir(parents=True)
    for name in (script, "gpu_env.sh"):
        shutil.copy2(ROOT / "examples" / name, checkout / "examples")
    calls = tmp_path / "calls.txt"
    for path in (checkout / ".venv" / "bin" / "python", tmp_path / "bin" / "python3"):
        path.parent.mkdir(parents=True)
        path.write_text(f'#!/usr/bin/env bash\necho "{path.parent.parent.name}" >> {calls}\nexit 3\n')
        path.chmod(0o755)
    args = ["pack", "work"] if script == "converged_gpu.sh" else ["--cpu"]
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "OUT": str(tmp_path / "out")}
    for expected in (".venv", tmp_path.name):
        subprocess.run(["bash", str(checkout / "examples" / script), *args], capture_output=True, env=env,
                       timeout=60)
        assert calls.read_text().split()[0] == expected
        calls.unlink()
        shutil.rmtree(checkout / ".venv", ignore_errors=True)


def test_the_gpu_session_runs_its_steps_in_order(tmp_path):
    """examples/gpu_session.sh --cpu: the speed benchmark, then the converged command (training nothing),
    both writing where the device tool collects them."""
    result = subprocess.run(["bash", str(ROOT / "examples" / "gpu_session.sh"), "--cpu"],
                            capture_output=True, text=True, env=gpu_command_env(tmp_path), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    speed = json.loads((tmp_path / "out" / "speed-gpu" / "speed.json").read_text())
    assert [row["system"] for row in speed["rows"]] == ["baseline", "mhc"]
    compiled = json.loads((tmp_path / "out" / "speed-gpu-compiled" / "speed.json").read_text())
    assert [row["system"] for row in compiled["rows"]] == ["baseline"]  # mHC on the GPU only: minutes to compile here
    assert compiled["args"]["model_args"] == "--compile-sinkhorn"
    assert "| converged-baseline-s1 | Transformer | 1 | pending |" in (tmp_path / "out" / "converged-cpu.md").read_text()
    assert "| converged-baseline-s1 |" in (tmp_path / "out" / "gpu-session.log").read_text()  # its whole log


def test_the_continued_rows_run_elsewhere_from_a_packed_converged_transformer(quick_converged, tmp_path):
    """reference_pack carries the converged Transformer (data, subwords, best checkpoint without its optimizer,
    its scored row); a run importing it trains only the continued rows, at the learning rate the Transformer
    reached on its own schedule, and they train as they did where the Transformer converged."""
    workdir, publish, _ = quick_converged
    pack = tmp_path / "pack"
    packed = subprocess.run([sys.executable, "-m", "fairseq_capsagg.pipeline.reference_pack", str(workdir), str(pack)],
                            capture_output=True, text=True, timeout=300)
    assert packed.returncode == 0, packed.stderr[-3000:]
    best = workdir / "checkpoints" / "converged-baseline-s1" / "checkpoint_best.pt"
    assert (pack / "checkpoint_best.pt").stat().st_size < best.stat().st_size / 2  # no optimizer state
    other, out = tmp_path / "other", tmp_path / "out"
    # another peak learning rate here: the continued rows must still take the packed Transformer's schedule
    result = table1("--quick", "--table", "converged", "--workdir", str(other), "--reference-from", str(pack),
                    "--rows", "converged-baseline-s1,continued-baseline", "--lr", "1e-3", "--publish", str(out))
    assert "[main-job] train converged-baseline-s1 ..." not in result.stdout
    assert "[main-job] train continued-baseline ..." in result.stdout
    source = json.loads((publish / "converged-cpu.json").read_text())["results"]
    payload = json.loads((out / "converged-cpu.json").read_text())
    imported, row = payload["results"]["converged-baseline-s1"], payload["results"]["continued-baseline"]
    assert imported["imported_from"] == str(workdir.resolve())
    assert {k: v for k, v in imported.items() if k != "imported_from"} == source["converged-baseline-s1"]
    assert row["lr"] == pytest.approx(source["continued-baseline"]["lr"])
    log = (other / "logs" / "train-continued-baseline" / "from-0.log").read_text()
    assert f"loading pretrained model from {other}/checkpoints/converged-baseline-s1/checkpoint_best.pt" in log
    assert [p["update"] for p in row["curve"]] == [p["update"] for p in source["continued-baseline"]["curve"]]
    for here, there in zip(row["curve"], source["continued-baseline"]["curve"]):
        assert here["loss"] == pytest.approx(there["loss"], abs=2e-3)  # the same start, data and schedule
    assert row["delta_bleu"] == pytest.approx(row["bleu"] - imported["bleu"], abs=0.01)
    assert f"`converged-baseline-s1` imported from {workdir.resolve()}" in (out / "converged-cpu.md").read_text()
    assert converged_table(payload) == (out / "converged-cpu.md").read_text()


def test_a_pack_of_other_data_settings_is_one_clear_line(quick_converged, tmp_path):
    workdir, _, _ = quick_converged
    pack = reference_pack.export(workdir, tmp_path / "pack")
    result = table1("--quick", "--table", "converged", "--workdir", str(tmp_path / "w"), "--reference-from", str(pack),
                    "--shape", "base", check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"table1: error: --reference-from {pack}: its Transformer was trained with other data settings " \
           "(shape: small there, base here); rerun with the pack's settings" in result.stderr
    missing = table1("--quick", "--table", "converged", "--workdir", str(tmp_path / "v"), "--reference-from",
                     str(tmp_path / "nothing"), check=False)
    assert missing.returncode == 2 and "no reference.json there" in missing.stderr


def test_the_gpu_command_imports_the_packed_transformer(quick_converged, tmp_path):
    """examples/converged_gpu.sh pack, then run (--quick, training nothing): the packed Transformer is the
    table's converged row, imported, and its only row from scratch; its continued rows wait for the GPU."""
    workdir, publish, _ = quick_converged
    env = dict(gpu_command_env(tmp_path), PACK=str(tmp_path / "pack"))
    script = str(ROOT / "examples" / "converged_gpu.sh")
    assert subprocess.run(["bash", script, "packed"], env=env).returncode == 1
    packed = subprocess.run(["bash", script, "pack", str(workdir)], capture_output=True, text=True, env=env,
                            timeout=300)
    assert packed.returncode == 0, packed.stderr[-3000:]
    assert subprocess.run(["bash", script, "packed"], env=env).returncode == 0
    result = subprocess.run(["bash", script, "run", "--quick", "--report-only"], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    payload = json.loads((tmp_path / "out" / "converged-cpu.json").read_text())
    source = json.loads((publish / "converged-cpu.json").read_text())["results"]["converged-baseline-s1"]
    assert payload["results"]["converged-baseline-s1"]["bleu"] == source["bleu"]
    assert payload["config"]["reference_from"] == str((tmp_path / "pack").resolve())
    assert re.search(r"\| continued-emrouting \| [^|]+ \| \d \| pending \|", (tmp_path / "out" / "converged-cpu.md")
                     .read_text())
    # the rows from scratch are not this table's: they would be read against a Transformer trained elsewhere
    assert [row["name"] for row in payload["rows"] if row["protocol"] == "converged"] == ["converged-baseline-s1"]
    refused = subprocess.run(["bash", script, "run", "--quick", "--report-only", "--rows", "converged-mudd-s1"],
                             capture_output=True, text=True, env=env, timeout=300)
    assert refused.returncode == 2 and "--rows: unknown ['converged-mudd-s1']" in refused.stderr


def still_training(workdir, dest):
    """A copy of the quick converged work directory as it was before its Transformer's rule stopped it:
    checkpoints and logs on disk, its training not recorded as done."""
    shutil.copytree(workdir, dest)
    stages = json.loads((dest / "stages.json").read_text())
    (dest / "stages.json").write_text(json.dumps({k: v for k, v in stages.items() if k in stage_names.DATA_STAGES}))
    return dest


def test_a_transformer_still_training_is_scored_and_packed_as_a_snapshot(quick_converged, tmp_path):
    """examples/converged_gpu.sh snapshot: the Transformer's best checkpoint so far, frozen, scored as a converged
    row is (the same checkpoint, the same BLEU) and packed; the importing table marks it "(snapshot)"."""
    workdir, publish, _ = quick_converged
    training = still_training(workdir, tmp_path / "training")
    env = dict(gpu_command_env(tmp_path), PACK=str(tmp_path / "pack"), SNAPSHOT=str(tmp_path / "snapshot"))
    script = str(ROOT / "examples" / "converged_gpu.sh")
    made = subprocess.run(["bash", script, "snapshot", str(training), "--quick"], capture_output=True, text=True,
                          env=env, timeout=600)
    assert made.returncode == 0, made.stderr[-3000:]
    assert json.loads((training / "stages.json").read_text()).keys() == set(stage_names.DATA_STAGES)  # untouched
    source = json.loads((publish / "converged-cpu.json").read_text())["results"]["converged-baseline-s1"]
    frozen = json.loads((tmp_path / "snapshot" / "converged.json").read_text())["results"]["converged-baseline-s1"]
    assert frozen["snapshot"] is True and frozen["converged"] is False
    for key in ("stopped_at", "best_update", "best_loss", "bleu", "chrf", "curve"):
        assert frozen[key] == source[key], key
    assert frozen["average"]["updates"] == source["average"]["updates"]
    assert subprocess.run(["bash", script, "packed"], env=env).returncode == 0
    result = subprocess.run(["bash", script, "run", "--quick", "--report-only"], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    table = (tmp_path / "out" / "converged-cpu.md").read_text()
    assert f"| converged-baseline-s1 | Transformer | 1 | {source['stopped_at']} (snapshot) |" in table
    assert f"frozen while its rule had not stopped it (`converged-baseline-s1` at update {source['stopped_at']};" \
           in table


def test_a_snapshot_refuses_a_finished_run_and_a_taken_destination(quick_converged, tmp_path):
    workdir, _, _ = quick_converged
    with pytest.raises(snapshot.SnapshotError, match="has finished training; score and pack .* itself"):
        snapshot.freeze(workdir, tmp_path / "a")
    training = still_training(workdir, tmp_path / "training")
    (tmp_path / "taken").mkdir()
    with pytest.raises(snapshot.SnapshotError, match="exists; a snapshot goes into a new work directory"):
        snapshot.freeze(training, tmp_path / "taken")
    shutil.rmtree(training / "checkpoints")
    result = subprocess.run([sys.executable, "-m", "fairseq_capsagg.pipeline.snapshot", str(training),
                             str(tmp_path / "b")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "snapshot: error: " in result.stderr and "has no checkpoint yet (no checkpoint_best.pt)" in result.stderr
    assert not (tmp_path / "b").exists()
