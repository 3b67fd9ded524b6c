"""The converged comparison (capsagg-table1 --table converged, --quick): rows trained to the resumable
stop rule in segments, continued rows from the converged best checkpoint, the published table and curves."""

import json
import shutil
from pathlib import Path

import pytest

from fairseq_capsagg.pipeline import equivalence, provenance
from fairseq_capsagg.pipeline.experiment import QUICK
from helpers import table1
from published import converged_table


CONVERGED_ROWS = "converged-baseline-s1,continued-baseline"
LENPEN = ("--lenpen-grid", "2,1")  # every row also at its tuned length penalty, on a grid that keeps it quick


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
    assert "[table1] train continued-baseline ..." not in again.stdout
    assert (tmp_path / "converged-cpu.md").read_text() == table


def test_a_converged_rule_off_the_validation_grid_is_one_clear_line(tmp_path):
    result = table1("--table", "converged", "--workdir", str(tmp_path / "w"), "--patience-updates", "1234", check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "error: --validate-interval-updates 500, --patience-updates 1234" in result.stderr


def reference_table(path, losses):
    """A converged table whose Transformer's validation curve is ``losses`` at every --quick validation."""
    curve = [{"update": 5 * (i + 1), "loss": loss, "nll_loss": loss} for i, loss in enumerate(losses)]
    path.write_text(json.dumps({"results": {equivalence.REFERENCE: {"curve": curve}}}))
    return path


def speed_json(path, device, ratios):
    """``benchmarks/speed.py``'s JSON measured on ``device``: the small training-speed ``ratios`` by system."""
    rows = [{"shape": "small", "system": system, "train_tokens_per_s_ratio": ratio} for system, ratio in ratios.items()]
    path.write_text(json.dumps({"device": device, "rows": rows}))
    return path


OTHER_CPU = "CPU (Another CPU, AVX2 kernels, 2 cores)"


def test_compute_equivalence_rows_train_to_the_cap_and_are_placed_on_the_reference_curves(tmp_path):
    """--table compute-equivalence --quick: every row from scratch to the cap (no early stop), read at its
    checkpoints against two Transformer runs given as JSON, their own band beside it, in seconds with the speed
    ratios of the machine each row trained on; published under its own name with its plot."""
    runs = [reference_table(tmp_path / "run1.json", [13.0, 12.0, 11.0, 10.0, 9.0, 8.0]),
            reference_table(tmp_path / "run2.json", [13.0, 12.2, 11.0, 10.2, 9.0, 8.0])]
    here = speed_json(tmp_path / "here.json", provenance.device_name(gpu=False), {"dwa": 0.5, "hc": 0.8})
    other = speed_json(tmp_path / "other.json", OTHER_CPU, {"dwa": 0.9, "hc": 0.25})
    speeds = ["--speed-json", str(other), "--speed-json", str(here)]
    result = table1("--quick", "--table", "compute-equivalence", "--systems", "dwa", "--workdir",
                    str(tmp_path / "work"), "--reference-curve", str(runs[0]), "--reference-curve", str(runs[1]),
                    *speeds, "--publish", str(tmp_path / "out"))
    assert "[table1] train scratch-dwa-s1 ..." in result.stdout
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "compute-equivalence.json", "compute-equivalence.md", "compute-equivalence.png"]
    payload = json.loads((tmp_path / "out" / "compute-equivalence.json").read_text())
    row = payload["results"]["scratch-dwa-s1"]
    assert row["stopped_at"] == QUICK["update_cap"] and row["converged"] is False  # the cap, never the patience
    table = payload["compute_equivalence"]
    assert table["points"] == [5, 10, 15, 20] and table["references"] == [str(r) for r in runs]
    # the two runs placed on each other: at 10 updates run 2's 12.2 is reached by run 1 at 5 + 5 * 0.8 / 1.0, run 1's
    # 12.0 by run 2 at 10 + 5 * 0.2 / 1.2
    assert table["noise_band"]["10"] == pytest.approx([0.9, (10 + 5 / 6) / 10])
    for point in table["rows"]["scratch-dwa-s1"]:
        loss = next(p["loss"] for p in row["curve"] if p["update"] == point["update"])
        assert point["loss"] == loss
        for name, reached in point["reference_updates"].items():
            curve = json.loads(Path(name).read_text())["results"][equivalence.REFERENCE]["curve"]
            expected = equivalence.updates_to_reach(curve, loss)
            assert reached == expected
        # this machine's ratio, not the other CPU's
        assert point["seconds_ratio"] == pytest.approx([r * 0.5 for r in point["updates_ratio"]])
    markdown = (tmp_path / "out" / "compute-equivalence.md").read_text()
    assert "| scratch-dwa-s1 | + DenseFormer DWA | 20 |" in markdown and "Test split at the last update" in markdown
    assert payload["config"]["update_cap"] == QUICK["update_cap"] and "patience_updates" not in payload["config"]

    # a row another machine trained and published stays in the table this work directory publishes, read with
    # that machine's speed ratio
    payload["results"]["scratch-hc-s1"] = {**row, "name": "scratch-hc-s1", "system": "hc", "device": OTHER_CPU}
    (tmp_path / "out" / "compute-equivalence.json").write_text(json.dumps(payload))
    common = ["--quick", "--table", "compute-equivalence", "--systems", "dwa,hc", "--workdir", str(tmp_path / "work"),
              "--reference-curve", str(runs[0]), "--reference-curve", str(runs[1]), *speeds]
    table1(*common, "--report-only", "--publish", str(tmp_path / "out"))
    merged = json.loads((tmp_path / "out" / "compute-equivalence.json").read_text())
    assert set(merged["results"]) == {"scratch-dwa-s1", "scratch-hc-s1"}
    assert set(merged["compute_equivalence"]["rows"]) == {"scratch-dwa-s1", "scratch-hc-s1"}
    for point in merged["compute_equivalence"]["rows"]["scratch-hc-s1"]:
        assert point["seconds_ratio"] == pytest.approx([r * 0.25 for r in point["updates_ratio"]])
    markdown = (tmp_path / "out" / "compute-equivalence.md").read_text()
    assert f"`{other}` on {OTHER_CPU}" in markdown and f"`{here}` on {provenance.device_name(gpu=False)}" in markdown
    # without a speed measured on a row's machine, no seconds for that row (not another machine's)
    table1(*common[:-4], "--speed-json", str(here), "--report-only", "--publish", str(tmp_path / "out"))
    alone = json.loads((tmp_path / "out" / "compute-equivalence.json").read_text())["compute_equivalence"]["rows"]
    assert all(p["seconds_ratio"] is None for p in alone["scratch-hc-s1"])
    assert all(p["seconds_ratio"] is not None for p in alone["scratch-dwa-s1"] if p["updates_ratio"] is not None)
    # a row whose checkpoints were removed after it was published is neither scored again nor trained again
    shutil.rmtree(tmp_path / "work" / "checkpoints" / "scratch-dwa-s1")
    kept = table1(*common[:4], "dwa", *common[5:], "--publish", str(tmp_path / "out"))
    assert "scratch-dwa-s1: trained here before, its checkpoints removed since" in kept.stdout
    assert "train scratch-dwa-s1 ..." not in kept.stdout
    republished = json.loads((tmp_path / "out" / "compute-equivalence.json").read_text())
    assert republished["results"] == merged["results"]
    # but not one of other settings
    merged["config"]["lr"] = 1.0
    (tmp_path / "out" / "compute-equivalence.json").write_text(json.dumps(merged))
    refused = table1(*common, "--report-only", "--publish", str(tmp_path / "out"), check=False)
    assert refused.returncode == 2 and "--publish: " in refused.stderr and "holds rows of other settings" in \
        refused.stderr


def test_two_speed_files_of_one_machine_or_a_missing_one_are_one_clear_line(tmp_path):
    run = reference_table(tmp_path / "run.json", [13.0, 12.0, 11.0, 10.0, 9.0, 8.0])
    speeds = [speed_json(tmp_path / f"{name}.json", OTHER_CPU, {"dwa": 0.5}) for name in ("a", "b")]
    result = table1("--table", "compute-equivalence", "--workdir", str(tmp_path / "w"), "--reference-curve", str(run),
                    "--speed-json", str(speeds[0]), "--speed-json", str(speeds[1]), check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"error: --speed-json: {speeds[0]} and {speeds[1]} were both measured on {OTHER_CPU}" in result.stderr
    absent = table1("--table", "compute-equivalence", "--workdir", str(tmp_path / "w"), "--reference-curve", str(run),
                    "--speed-json", str(speeds[0]), "--speed-json", str(tmp_path / "typo.json"), check=False)
    assert absent.returncode == 2 and "Traceback" not in absent.stderr
    assert f"error: --speed-json: {tmp_path / 'typo.json'} does not exist" in absent.stderr


@pytest.mark.parametrize("flags,error", [
    ((), "--reference-curve: required with --table compute-equivalence"),
    (("--reference-curve", "nothing.json"), "--reference-curve: nothing.json is not a converged table"),
    (("--patience-updates", "1000"), "--patience-updates: not with --table compute-equivalence"),
])
def test_compute_equivalence_settings_are_one_clear_line(tmp_path, flags, error):
    result = table1("--table", "compute-equivalence", "--workdir", str(tmp_path / "w"), *flags, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert error in result.stderr
