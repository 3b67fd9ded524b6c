"""Training to convergence: the resumable stop rule, the curves and speeds read from fairseq's logs,
checkpoint averages and the search-error count (no training: fairseq is simulated by its files)."""

import argparse
from pathlib import Path
from typing import Dict, List

import pytest
import torch
from fairseq.optim import FairseqOptimizer
from fairseq.optim.lr_scheduler.inverse_square_root_schedule import (
    InverseSquareRootLRScheduleConfig,
    InverseSquareRootSchedule,
)

from fairseq_capsagg.pipeline.drivers import converged

from fairseq_capsagg.pipeline.reports import converged_report

from fairseq_capsagg.pipeline import convergence, fairseq_runs, train_logs
from fairseq_capsagg.pipeline.experiment import Stages
from fairseq_capsagg.pipeline.rows import Decoding
from helpers import TRAIN_LOG, build_tiny_model

#: A validation-loss curve that improves, stalls, improves once more late, then stalls for good.
CURVE = {u: loss for u, loss in zip(range(10, 400, 10), [
    9.0, 8.5, 8.2, 8.0, 7.9, 7.95, 7.93, 7.91, 7.92, 7.85, 7.86, 7.87, 7.9, 7.88, 7.86, 7.89, 7.9, 7.91, 7.92,
    7.93, 7.94, 7.95, 7.96, 7.97, 7.98, 7.99, 8.0, 8.01, 8.02, 8.03, 8.04, 8.05, 8.06, 8.07, 8.08, 8.09, 8.1,
    8.11, 8.12])}


def uninterrupted_stop(rule: convergence.StopRule, curve: Dict[int, float]):
    """fairseq's --patience (validations without a strictly better loss), in one uninterrupted run."""
    best_update, best = 0, float("inf")
    for update in sorted(curve):
        if curve[update] < best:
            best_update, best = update, curve[update]
        if update - best_update >= rule.patience or update >= rule.cap:
            return update, best_update
    raise AssertionError("the curve ends before the rule stops")


def save(path: Path, update: int, loss: float) -> None:
    torch.save({"optimizer_history": [{"num_updates": update}], "extra_state": {"val_loss": loss}}, path)


class FakeFairseq:
    """Writes what fairseq-train writes at each validation: checkpoint_last.pt, and checkpoint_best.pt when
    the loss is at least as good as the best so far (restored from disk, as fairseq restores it);
    ``crash_at`` stops one segment after that update, as a killed process would."""

    def __init__(self, save_dir: Path, rule: convergence.StopRule, crash_at: int = 0):
        self.save_dir, self.rule, self.crash_at = save_dir, rule, crash_at
        self.segments: List[tuple] = []

    def __call__(self, start: int, max_update: int) -> None:
        self.segments.append((start, max_update))
        best_file = self.save_dir / "checkpoint_best.pt"
        best = convergence.checkpoint_updates(best_file)[1] if best_file.exists() else None
        for update in range(start + self.rule.interval, max_update + 1, self.rule.interval):
            if best is None or CURVE[update] <= best:
                best = CURVE[update]
                save(best_file, update, best)
            save(self.save_dir / "checkpoint_last.pt", update, CURVE[update])
            if update == self.crash_at:
                self.crash_at = 0
                raise KeyboardInterrupt("killed")


@pytest.mark.parametrize("crash_at", [0, 40, 100, 150])
def test_a_resumed_run_stops_where_an_uninterrupted_one_would(tmp_path, crash_at):
    rule = convergence.StopRule(interval=10, patience=60, cap=380)
    fake = FakeFairseq(tmp_path, rule, crash_at)
    if crash_at:
        with pytest.raises(KeyboardInterrupt):
            convergence.train_in_segments(fake, tmp_path, rule.target)
    progress = convergence.train_in_segments(fake, tmp_path, rule.target)
    stopped_at, best_update = uninterrupted_stop(rule, CURVE)
    assert (progress["stopped_at"], progress["best_update"]) == (stopped_at, best_update) == (160, 100)
    assert progress["best_loss"] == CURVE[100] and rule.converged(best_update, stopped_at)
    # segments end at best + patience; the late improvement at 100 extended the run past 110
    assert fake.segments[0] == (0, 60) and fake.segments[-1][1] == 160


def test_the_cap_stops_a_run_that_still_improves(tmp_path):
    rule = convergence.StopRule(interval=10, patience=60, cap=50)
    progress = convergence.train_in_segments(FakeFairseq(tmp_path, rule), tmp_path, rule.target)
    assert progress["stopped_at"] == 50 and progress["best_update"] == 50
    assert not rule.converged(progress["best_update"], progress["stopped_at"])


def test_a_fixed_number_of_updates_ignores_the_best(tmp_path):
    rule = convergence.StopRule(interval=10, patience=20, cap=380)
    progress = convergence.train_in_segments(FakeFairseq(tmp_path, rule), tmp_path, lambda best: 300)
    assert progress["stopped_at"] == 300 and progress["best_update"] == 100


def test_a_segment_that_saves_nothing_is_an_error_not_a_loop(tmp_path):
    with pytest.raises(fairseq_runs.ToolFailed, match="without saving past update 0"):
        convergence.train_in_segments(lambda start, end: None, tmp_path, lambda best: 100)


@pytest.mark.parametrize("interval,patience,cap", [(0, 10, 10), (10, 5, 100), (10, 25, 100), (10, 20, 95)])
def test_a_rule_off_the_validation_grid_is_refused(interval, patience, cap):
    with pytest.raises(ValueError, match="--patience-updates .* multiples of the validation interval"):
        convergence.StopRule(interval, patience, cap)


def test_fairseq_validates_and_saves_on_the_update_grid_only():
    flags = convergence.StopRule(500, 3000, 30000).fairseq_flags()
    pairs = dict(zip(flags[::2], flags[1::2]))
    assert pairs["--validate-interval-updates"] == pairs["--save-interval-updates"] == "500"
    assert int(pairs["--validate-interval"]) > 1000 and int(pairs["--save-interval"]) > 1000  # no epoch-end ones
    assert pairs["--keep-interval-updates"] == str(convergence.AVERAGED)


def test_curves_and_speeds_are_read_from_every_segment(tmp_path):
    first, resumed = tmp_path / "from-0.log", tmp_path / "from-10.log"
    first.write_text(TRAIN_LOG)
    # the resumed segment validated update 20 again (the first was killed after validating, before saving)
    resumed.write_text(TRAIN_LOG.splitlines()[3].replace("loss 9.066", "loss 9.065") + "\n")
    curve = train_logs.validation_curve([first, resumed])
    assert curve == [{"update": 10, "loss": 9.336, "nll_loss": 9.201}, {"update": 20, "loss": 9.065, "nll_loss": 8.837}]
    stretches = train_logs.train_stretches([first, resumed])
    assert [s["ups"] for s in stretches] == [0.17, 0.18] and stretches[1]["lr"] == pytest.approx(1.41421e-3)
    assert stretches[0]["gnorm"] == 1.337 and stretches[0]["clip"] == 60
    assert convergence.first_reaching(curve, 9.1) == 20 and convergence.first_reaching(curve, 9.0) is None


def test_idle_speed_is_the_upper_decile_so_shared_stretches_do_not_lower_it():
    idle, shared = [0.85] * 12, [0.4] * 8
    assert convergence.idle_speed(shared + idle) == 0.85
    assert convergence.idle_speed([0.5]) == 0.5 and convergence.idle_speed([]) is None


class RecordingOptimizer(FairseqOptimizer):
    def __init__(self):  # noqa: D107 (no parameters: only the learning rate is looked at)
        self.lr = None

    def set_lr(self, lr):
        self.lr = lr

    def get_lr(self):
        return self.lr


@pytest.mark.parametrize("update", [0, 1, 150, 200, 201, 4000, 15000])
def test_the_continued_learning_rate_is_fairseqs_inverse_sqrt(update):
    optimizer = RecordingOptimizer()
    schedule = InverseSquareRootSchedule(InverseSquareRootLRScheduleConfig(
        warmup_updates=200, warmup_init_lr=fairseq_runs.WARMUP_INIT_LR, lr=[2e-3]), optimizer)
    schedule.step_update(update)
    assert fairseq_runs.inverse_sqrt_lr(update, 2e-3, 200) == pytest.approx(optimizer.get_lr(), rel=1e-9)


def test_the_continued_rows_keep_a_constant_rate_after_the_warm_up():
    flags = fairseq_runs.schedule_flags({"schedule": "fixed", "warmup": 200})
    assert flags == ["--lr-scheduler", "fixed", "--warmup-updates", "200"]
    assert "inverse_sqrt" in fairseq_runs.schedule_flags({"warmup": 200})


def test_averaging_keeps_tied_weights_tied_and_drops_the_optimizer(tmp_path):
    paths = []
    for i in range(3):
        shared = torch.full((2, 2), float(i))
        state = {"model": {"embed.weight": shared, "output.weight": shared, "bias": torch.tensor([i * 2.0])},
                 "cfg": {"model": "x"}, "last_optimizer_state": {"big": 1}, "optimizer_history": [{"num_updates": i}]}
        paths.append(tmp_path / f"checkpoint_1_{(i + 1) * 10}.pt")
        torch.save(state, paths[-1])
    out = convergence.average_checkpoints(paths, tmp_path / "average.pt")
    averaged = torch.load(out, weights_only=True)
    torch.testing.assert_close(averaged["model"]["embed.weight"], torch.ones(2, 2), rtol=0, atol=0)
    torch.testing.assert_close(averaged["model"]["bias"], torch.tensor([2.0]), rtol=0, atol=0)
    assert averaged["model"]["embed.weight"].data_ptr() == averaged["model"]["output.weight"].data_ptr()
    assert averaged["last_optimizer_state"] is None and averaged["cfg"] == {"model": "x"}
    assert convergence.interval_checkpoints(tmp_path) == paths  # by update, not by name
    (tmp_path / "checkpoint_1_5.pt").write_bytes(b"")
    assert convergence.interval_checkpoints(tmp_path)[0].name == "checkpoint_1_5.pt"


def test_search_errors_count_references_the_model_prefers(tmp_path):
    hyps, refs = tmp_path / "h.txt", tmp_path / "r.txt"
    hyps.write_text("S-0\tx\nH-0\t-0.5\ta b\nD-0\t-0.5\ta b\nH-1\t-1.25\tc\nH-2\t-2\td\n")
    refs.write_text("H-0\t-0.75\ta c\nH-1\t-1e-01\tc d\nH-3\t-1\te\n")
    errors = convergence.search_errors(convergence.hypothesis_scores(hyps), convergence.hypothesis_scores(refs))
    assert errors == {"sentences": 2, "search_error_share": 0.5, "mean_hypothesis_score": -0.875,
                      "mean_reference_score": -0.425}
    assert convergence.search_errors({}, {}) == {"sentences": 0}


def test_compute_equivalence_is_read_from_the_curves():
    from fairseq_capsagg.pipeline.drivers.converged import REFERENCE
    from fairseq_capsagg.pipeline.reports.converged_report import compute_equivalence
    from fairseq_capsagg.pipeline.rows import Row

    def curve(*losses):
        return [{"update": 100 * (i + 1), "loss": loss} for i, loss in enumerate(losses)]

    rows = [Row(REFERENCE, "baseline", "converged", 1, REFERENCE), Row("continued-baseline", "baseline", "continued", 1, REFERENCE),
            Row("converged-dyncomb-s1", "dyncomb", "converged", 1, REFERENCE),
            Row("converged-emrouting-s1", "emrouting", "converged", 1, REFERENCE)]
    results = {REFERENCE: {"curve": curve(9, 7, 6, 5.5, 5.6), "idle_updates_per_s": 1.0},
               "continued-baseline": {"curve": curve(5.4), "idle_updates_per_s": 1.0},
               "converged-dyncomb-s1": {"curve": curve(8, 6, 5.5), "idle_updates_per_s": 0.5},
               "converged-emrouting-s1": {"curve": curve(9, 8, 7, 6), "idle_updates_per_s": 0.5}}
    eq = compute_equivalence(rows, results)
    assert eq["target_loss"] == 5.5 and set(eq["rows"]) == {REFERENCE, "converged-dyncomb-s1", "converged-emrouting-s1"}
    assert eq["rows"]["converged-dyncomb-s1"] == {"updates": 300, "seconds": 600, "updates_ratio": 1.33,
                                                  "seconds_ratio": 0.67}
    assert eq["rows"]["converged-emrouting-s1"]["updates"] is None
    assert compute_equivalence(rows, {k: v for k, v in results.items() if k != REFERENCE}) is None


def test_the_paper_protocol_continues_only_systems_that_start_as_the_transformer():
    """Every continued row starts where the converged Transformer is (DLCL, which starts as its paper's uniform
    average, only from scratch); each continued system is also trained from scratch to convergence."""
    rows = converged.converged_rows(converged.default_systems(), converged.SECOND_SEED)
    continued = [row.system for row in rows if row.protocol == "continued" and row.system != "baseline"]
    assert all(fairseq_runs.family_class(s).starts_as_transformer for s in continued)
    assert {"hc", "mhc"} <= set(continued) and "dlcl" not in continued
    from_scratch = {row.system for row in rows if row.protocol == "converged"}
    assert set(continued) | {"dlcl"} <= from_scratch


def test_the_paper_protocol_has_its_own_seed_noise_before_the_rows_from_scratch():
    """The second seed of the Transformer also continues from the converged checkpoint (against the first
    continued Transformer: the noise the continued aggregators' differences are read against), right after the
    continued rows; a second seed of a system the protocol does not continue (DLCL) only trains from scratch."""
    rows = converged.converged_rows(converged.default_systems(), ["baseline", "dlcl"])
    names = [row.name for row in rows]
    noise = rows[names.index("continued-baseline-s2")]
    assert (noise.system, noise.protocol, noise.seed, noise.reference) == ("baseline", "continued", 2,
                                                                           converged.CONTINUED_REFERENCE)
    continued = [i for i, row in enumerate(rows) if row.protocol == "continued"]
    assert continued == list(range(1, len(continued) + 1)) and names[continued[-1]] == "continued-baseline-s2"
    assert "continued-dlcl-s2" not in names and {"converged-baseline-s2", "converged-dlcl-s2"} <= set(names)


@pytest.mark.parametrize("second_seed,continued_ref,scratch_ref", [
    (["baseline", "dyncomb"], "continued-baseline-s2", "converged-baseline-s2"),
    (["dyncomb"], converged.CONTINUED_REFERENCE, converged.REFERENCE)])
def test_an_aggregators_second_seed_is_paired_with_the_transformer_of_its_seed(second_seed, continued_ref,
                                                                               scratch_ref):
    """Same-seed rows see the same batches and dropout draws (fairseq reseeds every update with seed + update),
    so an aggregator's second seed is compared with the Transformer's second seed where that row exists, and
    the table's titles say so; without it, with the first seed's."""
    rows = {row.name: row for row in converged.converged_rows(converged.default_systems(), second_seed)}
    assert rows["continued-dyncomb-s2"].reference == continued_ref
    assert rows["converged-dyncomb-s2"].reference == scratch_ref
    assert all(row.reference == converged.CONTINUED_REFERENCE for name, row in rows.items()
               if name.startswith("continued-") and name != "continued-dyncomb-s2" and row.system != "baseline")
    args = argparse.Namespace(warm_updates=3000, warmup=200, validate_interval_updates=500, patience_updates=3000,
                              update_cap=30000, lenpen_grid=[])
    titles = [line for line in converged_report.format_tables(list(rows.values()), {}, None, "", args).splitlines()
              if line.startswith("### ")]
    paired = "baseline" in second_seed
    assert ("`continued-dyncomb-s2` against `continued-baseline-s2`, the Transformer of the same seed" in titles[1]) \
        == paired
    assert ("`converged-dyncomb-s2` against `converged-baseline-s2`" in titles[0]) == paired


@pytest.mark.parametrize("system", converged.CONTINUED)
def test_every_continued_system_is_built_with_its_continuation_flags(system):
    """The paper's protocol's flags are ones the system accepts: the ramp to the output aggregate where there is
    one (the paper's aggregators; the peers connect blocks), the routing families' identity start."""
    flags = fairseq_runs.continuation_flags(system, 5)
    build_tiny_model(f"transformer_{system}_base", flags)
    assert ("--aggregation-ramp-updates" in flags) == (system in ("linagg", "dyncomb", "emrouting"))
    assert set(fairseq_runs.warm_start_flags(system)) <= set(flags)


def test_a_failed_row_is_listed_and_the_rows_after_it_still_train(tmp_path):
    """A converged run lasts days: a row whose fairseq-train fails is kept with why, the rows that do not need it
    train, the rows that do stay pending, and the table says which is which."""
    args = argparse.Namespace(workdir=tmp_path, validate_interval_updates=500, patience_updates=3000,
                              update_cap=30000, report_only=False, rows=[], warm_updates=3000, warmup=200,
                              lenpen_grid=[])
    rows = converged.converged_rows(["baseline", "dyncomb"], [])
    table = converged.ConvergedTable(args, Stages(tmp_path), Decoding(tmp_path / "data-bin", {}, [], 0))
    trained, reports = [], []

    def train(row):
        if row.name == converged.REFERENCE:
            raise fairseq_runs.ToolFailed("fairseq-train failed with exit code 1; its log is from-0.log")
        trained.append(row.name)
        table.stages.done[f"train {row.name}"] = {}

    table.train, table.evaluate, table.compared = train, lambda row: {}, lambda rows, results: {}
    table.run(rows, reports.append)
    assert trained == ["converged-dyncomb-s1"] and len(reports) == 3  # after the failure, the row, the end
    assert table.failures == {converged.REFERENCE: "fairseq-train failed with exit code 1; its log is from-0.log"}
    markdown = converged_report.format_tables(rows, {}, None, "caption", args, table.failures)
    assert (f"| {converged.REFERENCE} | Transformer | 1 | failed: fairseq-train failed with exit code 1; its log is "
            "from-0.log |") in markdown
    assert "| continued-dyncomb | + Dynamic Combination | 1 | pending |" in markdown


def test_every_report_lists_the_rows_trained_before_this_run_whatever_their_place_in_the_order(tmp_path):
    """A run may train some rows before rows listed earlier (``--rows``): a report written after a row of this run
    still lists every row trained by an earlier run."""
    args = argparse.Namespace(workdir=tmp_path, validate_interval_updates=500, patience_updates=3000,
                              update_cap=30000, report_only=False, rows=["continued-dyncomb"], warm_updates=3000,
                              warmup=200, lenpen_grid=[])
    rows = converged.converged_rows(["baseline", "dyncomb"], ["baseline"])
    table = converged.ConvergedTable(args, Stages(tmp_path), Decoding(tmp_path / "data-bin", {}, [], 0))
    def trained(name: str) -> None:
        table.stages.done[f"train {name}"] = {}
        table.save_dir(name).mkdir(parents=True)
        (table.save_dir(name) / "checkpoint_best.pt").touch()

    for name in (converged.REFERENCE, converged.CONTINUED_REFERENCE, "continued-baseline-s2"):
        trained(name)
    reports = []

    def train(row):
        trained(row.name)

    table.train, table.evaluate, table.continued_starts = train, lambda row: {"bleu": 1.0}, lambda: {}
    table.compared = lambda rows, results: dict(results)
    table.run(rows, reports.append)
    assert len(reports) == 2  # after the row, at the end
    assert set(reports[0]) == {converged.REFERENCE, converged.CONTINUED_REFERENCE, "continued-dyncomb",
                               "continued-baseline-s2"}
