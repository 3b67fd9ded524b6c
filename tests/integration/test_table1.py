"""The Table 1 command (--quick): both protocols, pending rows, step-0 losses, tuned length penalties,
resumability."""

import json
import re

import pytest

from fairseq_capsagg.analysis import scoring
from fairseq_capsagg.pipeline import fairseq_runs
from fairseq_capsagg.pipeline.experiment import QUICK, QUICK_MAX_LEN
from helpers import run_tool, table1


ROWS = "scratch-baseline-s1,warm-baseline,warm-emrouting"
LENPEN = ("--lenpen-grid", "2,1")  # two values keep the quick table quick


@pytest.fixture(scope="module")
def quick_table(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("table1")
    table1("--quick", "--workdir", str(workdir), "--rows", ROWS, *LENPEN)
    return workdir


def test_rows_are_compared_within_their_protocol(quick_table):
    payload = json.loads((quick_table / "table1.json").read_text())
    results = payload["results"]
    assert set(results) == set(ROWS.split(","))
    assert results["scratch-baseline-s1"]["updates"] == QUICK["max_update"]
    assert results["warm-baseline"]["updates"] == QUICK["warm_updates"]
    em = results["warm-emrouting"]
    assert em["updates"] == QUICK["warm_updates"] and em["reference"] == "warm-baseline"
    assert em["delta_bleu"] == pytest.approx(em["bleu"] - results["warm-baseline"]["bleu"], abs=0.01)
    assert 0 <= em["bootstrap_p"] <= 1 and 0 <= em["sign_p"] <= 1 and em["delta_params"] > 0
    for row in results.values():
        assert 0 <= row["brevity_penalty"] <= 1 and row["length_ratio"] >= 0 and len(row["precisions"]) == 4
        assert row["grad_norm"] > 0 and 0 <= row["clip_percent"] <= 100 and row["updates_per_s"] > 0
        assert 0 < row["valid"]["nll_loss"] < row["valid"]["loss"]  # label smoothing adds to the nll
    table = (quick_table / "table1.md").read_text()
    assert "| BP (length) |" in table
    assert "| scratch-emrouting-s1 | + EM Routing | 1 | pending |" in table
    assert "| scratch-emrouting-rawlayers-s1 | + EM Routing (--aggregation-layer-norm off) | 1 | pending |" in table
    assert "| scratch-emrouting-identity-s1 | + EM Routing (--routing-init identity) | 1 | pending |" in table
    assert "| scratch-dynrouting-inputsoftmax-s1 | + Dynamic Routing (--routing-softmax input) | 1 | pending |" in table
    assert "| scratch-emrouting-iter1-s1 | + EM Routing (--routing-iters 1) | 1 | pending |" in table
    assert "| scratch-emrouting-encoder-s1 | + EM Routing (--decoder-aggregation none) | 1 | pending |" in table
    assert "| warm-emrouting-encoder | + EM Routing (--decoder-aggregation none) | 1 | pending |" in table
    for system, label in (("baseline", "Transformer"), ("emrouting", "+ EM Routing"),
                          ("linagg", "+ Linear Combination"), ("dyncomb", "+ Dynamic Combination")):
        assert f"| scratch-{system}-s2 | {label} | 2 | pending |" in table  # the default second seeds
    assert f"| warm-emrouting | + EM Routing | 1 | {QUICK['warm_updates']} |" in table


def test_length_penalty_is_tuned_on_validation_for_each_row(quick_table):
    payload = json.loads((quick_table / "table1.json").read_text())
    results = payload["results"]
    for name, row in results.items():
        tuned = row["tuned"]
        assert set(tuned["valid_bleu"]) == {"1", "2"} and tuned["lenpen"] in (1.0, 2.0)
        assert tuned["valid_bleu"][f"{tuned['lenpen']:g}"] == max(tuned["valid_bleu"].values())
        assert 0 <= tuned["brevity_penalty"] <= 1 and tuned["bleu"] >= 0
        tuned_hyps = (quick_table / "translations" / f"{name}.lenpen.txt").read_text()
        if tuned["lenpen"] == 1.0:  # fairseq's default: the row's own decoding, not decoded again
            assert tuned_hyps == (quick_table / "translations" / f"{name}.txt").read_text()
        lenpen_dir = quick_table / "translations" / "lenpen"
        ids = [set(scoring.read_generate_output(lenpen_dir / f"{name}.valid.lenpen{lenpen}.txt")) for lenpen in ("1", "2")]
        # every sentence of the quick validation split (60: not a multiple of fairseq's default batch multiple 8)
        assert ids[0] == ids[1] == set(range(60))
    em, base = results["warm-emrouting"]["tuned"], results["warm-baseline"]["tuned"]
    assert em["delta_bleu"] == pytest.approx(em["bleu"] - base["bleu"], abs=0.01)
    assert 0 <= em["bootstrap_p"] <= 1 and em["sign_better"] + em["sign_worse"] <= 60
    table = (quick_table / "table1.md").read_text()
    assert "### Length penalty tuned on the validation split" in table
    assert f"| warm-emrouting | {em['valid_bleu']['1']:.2f} → " in table


def test_the_choice_from_one_nbest_decoding_is_fairseqs_own_decoding_at_that_length_penalty(quick_table, tmp_path):
    """The tuning decodes the validation split once (--nbest = --beam) and picks each length penalty's
    hypotheses from it; fairseq-generate run with that --lenpen returns the same ones, text for text."""
    nbest = scoring.read_nbest(quick_table / "translations" / "lenpen" / "warm-emrouting.valid.nbest.txt")
    assert set(nbest) == set(range(60)) and all(len(hyps) == QUICK["beam"] for hyps in nbest.values())
    own = tmp_path / "lenpen2.txt"
    hparams = {"pair": ("en", "de"), "beam": QUICK["beam"], "decode_batch": 32, "remove_bpe": "sentencepiece",
               "max_len": QUICK_MAX_LEN, "device_flags": ["--cpu"], "lenpen": 2.0}
    # fairseq's console script (the tuning's n-best decoding ran inside the driver's process)
    own.write_text(run_tool("fairseq-generate", *fairseq_runs.generate_args(
        quick_table / "data-bin", quick_table / "checkpoints" / "warm-emrouting" / "checkpoint_best.pt", hparams,
        subset="valid")).stdout)
    chosen = quick_table / "translations" / "lenpen" / "warm-emrouting.valid.lenpen2.txt"
    assert scoring.read_generate_output(chosen) == scoring.read_generate_output(own)

    def scores(path):
        return {int(i): float(score) for i, score in re.findall(r"^D-(\d+)\t([^\t]*)\t", path.read_text(), re.M)}

    assert scores(chosen) == pytest.approx(scores(own), rel=1e-5)  # and scored as fairseq scores them at 2


def test_a_bad_length_penalty_grid_is_one_clear_line(tmp_path):
    result = table1("--quick", "--workdir", str(tmp_path / "w"), "--lenpen-grid", "1,long", check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "error: --lenpen-grid: '1,long' is not a comma-separated list of numbers" in result.stderr


def test_warm_started_routing_begins_at_the_baselines_loss(quick_table):
    step0 = json.loads((quick_table / "table1.json").read_text())["warm_start_step0"]
    for arch in ("transformer_emrouting_small", "transformer_dynrouting_small"):
        assert step0[f"{arch} (identity + ramp)"]["loss"] == pytest.approx(step0["baseline"]["loss"], abs=1e-4)


def test_warm_started_dense_connections_begin_at_the_baselines_loss(quick_table):
    step0 = json.loads((quick_table / "table1.json").read_text())["warm_start_step0"]
    for family in ("dwa", "depthattn", "mudd", "hc"):
        assert step0[f"transformer_{family}_small"] == step0["baseline"]
    # mHC's streams start as copies mixed by H_res's rows, which sum to 1 to rounding (design.md, mHC's start)
    assert step0["transformer_mhc_small"] == pytest.approx(step0["baseline"], rel=1e-6)
    assert step0["transformer_dlcl_small"] != step0["baseline"]  # DLCL starts as the uniform average


def test_finished_rows_are_not_trained_again(quick_table, tmp_path):
    result = table1("--quick", "--workdir", str(quick_table), "--rows", ROWS, "--publish", str(tmp_path), *LENPEN)
    assert "[table1] train warm-emrouting ..." not in result.stdout
    assert "[table1] tune length penalty warm-emrouting over 1,2 ..." not in result.stdout
    assert (tmp_path / "table1-cpu.md").read_text() == (quick_table / "table1.md").read_text()


def test_peers_share_the_baseline_and_train_for_equal_wall_clock(quick_table, tmp_path):
    speed = tmp_path / "speed.json"
    ratios = {"baseline": 1.0, "emrouting": 0.5, "dwa": 0.8, "depthattn": 0.9, "mudd": 0.85, "dlcl": 0.85, "hc": 0.7,
              "mhc": 0.55}
    speed.write_text(json.dumps({"rows": [{"shape": "small", "system": s, "train_tokens_per_s_ratio": r}
                                          for s, r in ratios.items()]}))
    result = table1("--quick", "--workdir", str(quick_table), "--table", "peers", "--speed-json", str(speed),
                    "--rows", "scratch-dwa-s1,time-dwa-s1", "--publish", str(tmp_path), "--lenpen-grid", "")
    assert "[table1] train scratch-baseline-s1 ..." not in result.stdout  # shared with Table 1
    payload = json.loads((tmp_path / "peers-cpu.json").read_text())
    results = payload["results"]
    assert set(results) == {"scratch-baseline-s1", "scratch-dwa-s1", "time-dwa-s1"}
    assert results["scratch-dwa-s1"]["updates"] == QUICK["max_update"]
    assert results["time-dwa-s1"]["updates"] == round(QUICK["max_update"] * ratios["dwa"])
    assert results["time-dwa-s1"]["reference"] == "scratch-baseline-s1" and 0 <= results["time-dwa-s1"]["bootstrap_p"] <= 1
    assert payload["speed_ratios"]["ratios"]["emrouting"] == 0.5
    table = (tmp_path / "peers-cpu.md").read_text()
    assert "| time-emrouting-s1 | + EM Routing | 1 | pending |" in table
    assert "| scratch-mudd-s1 | + MUDD connections | 1 | pending |" in table
    assert "| warm-" not in table and "Warm start" not in table and "equal wall-clock" in table
    assert "| scratch-emrouting-s2 | + EM Routing | 2 | pending |" in table
    assert "scratch-dyncomb-s2" not in table and "scratch-linagg-s2" not in table  # second seeds of Table 1 only
    # Table 1 itself still lists the paper's systems only
    assert "scratch-dwa" not in (quick_table / "table1.md").read_text()


def test_peers_without_speed_ratios_is_one_clear_line(tmp_path):
    result = table1("--quick", "--workdir", str(tmp_path / "w"), "--table", "peers", "--speed-json",
                    str(tmp_path / "none.json"), check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"error: --speed-json: {tmp_path / 'none.json'} does not exist" in result.stderr


def test_peers_take_one_speed_file(tmp_path):
    """The equal wall-clock rows' updates come from this machine's ratios: one file, not one per machine."""
    result = table1("--quick", "--workdir", str(tmp_path / "w"), "--table", "peers", "--speed-json",
                    str(tmp_path / "a.json"), "--speed-json", str(tmp_path / "b.json"), check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "error: --speed-json: one file with --table peers" in result.stderr
