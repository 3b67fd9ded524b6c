"""The converged comparison's runs side by side, read from published tables written here."""

import json

from fairseq_capsagg.pipeline.replication import RUNS, UNSCORED, cli_main, replication_table
from fairseq_capsagg.tools.markdown_block import read_block


def scored(loss, bleu, delta=None, p=None, average=(0.0, None, None), search=0.04, curve=()):
    result = {"best_loss": loss, "bleu": bleu, "references": {"search_error_share": search},
              "average": {"bleu": average[0]}, "curve": [{"update": u, "loss": v} for u, v in curve]}
    if delta is not None:
        result.update(delta_bleu=delta, bootstrap_p=p)
    if average[1] is not None:
        result["average"].update(delta_bleu=average[1], bootstrap_p=average[2])
    return result


def publish(folder, name, rows, results):
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rows": [{"name": row} for row in rows], "results": results}))


ROWS = ["converged-baseline-s1", "continued-baseline", "continued-linagg", "continued-mudd"]


def test_rows_both_runs_scored_stand_side_by_side_in_the_first_runs_order(tmp_path):
    publish(tmp_path, RUNS[0], ROWS, {
        "continued-linagg": scored(4.540, 29.03, 0.10, 0.229, (29.37, -0.03, 0.316), 0.042),
        "converged-baseline-s1": scored(4.565, 29.0, average=(28.98, None, None), search=0.049,
                                        curve=[(500, 8.384), (1000, 7.085), (1500, 6.478)]),
        "continued-baseline": scored(4.542, 28.93, -0.07, 0.28, (29.40, 0.42, 0.012), 0.042)})
    publish(tmp_path, RUNS[1], ROWS, {
        # the second run validated one update more (2000) and its largest gap is the second validation's
        "converged-baseline-s1": scored(4.561, 29.21, average=(29.1, None, None), search=0.047,
                                        curve=[(500, 8.388), (1000, 7.101), (1500, 6.475), (2000, 6.103)]),
        "continued-linagg": scored(4.538, 29.3, 0.05, 0.3, (29.5, 0.01, 0.45), 0.04),
        "continued-mudd": scored(4.53, 29.4, 0.15, 0.1)})
    lines = replication_table(tmp_path).splitlines()
    # one cell for every run, the third (no table yet) unscored
    assert lines[2:] == [
        f"| converged-baseline-s1 | 4.565 / 4.561 / {UNSCORED} | 29.00 / 29.21 / {UNSCORED} | – / – / {UNSCORED} "
        f"| 28.98 / 29.10 / {UNSCORED} | – / – / {UNSCORED} | 4.9% / 4.7% / {UNSCORED} | 0.016 (1000, 3) |",
        f"| continued-linagg | 4.540 / 4.538 / {UNSCORED} | 29.03 / 29.30 / {UNSCORED} "
        f"| +0.10 (0.229) / +0.05 (0.300) / {UNSCORED} | 29.37 / 29.50 / {UNSCORED} "
        f"| −0.03 (0.316) / +0.01 (0.450) / {UNSCORED} | 4.2% / 4.0% / {UNSCORED} | – |"]


def test_a_third_run_adds_a_cell_to_every_row_and_the_rows_only_later_runs_scored(tmp_path):
    """A row scored by the second and third runs only is listed after the first run's rows, the first run's cells
    marked unscored; the curves' gap is the largest between any two runs, with the validations those two share."""
    publish(tmp_path, RUNS[0], ROWS[:2], {
        "converged-baseline-s1": scored(4.565, 29.0, average=(28.98, None, None), search=0.049,
                                        curve=[(500, 8.384), (1000, 7.085)])})
    publish(tmp_path, RUNS[1], ROWS, {
        "converged-baseline-s1": scored(4.573, 28.5, average=(29.2, None, None), search=0.047,
                                        curve=[(500, 8.390), (1000, 7.090)]),
        "continued-mudd": scored(4.546, 29.49, 0.38, 0.009, (29.47, 0.06, 0.229), 0.031)})
    publish(tmp_path, RUNS[2], ROWS + ["continued-hc"], {
        # against the first run 0.004 at 500; against the second 0.010 at 500, the two validations they share
        "converged-baseline-s1": scored(4.570, 28.8, average=(29.0, None, None), search=0.045,
                                        curve=[(500, 8.380), (1000, 7.086), (1500, 6.47)]),
        "continued-mudd": scored(4.55, 29.2, -0.1, 0.3, (29.3, 0.0, 0.5), 0.04),
        "continued-hc": scored(4.55, 29.3, 0.1, 0.2)})
    assert replication_table(tmp_path).splitlines()[2:] == [
        "| converged-baseline-s1 | 4.565 / 4.573 / 4.570 | 29.00 / 28.50 / 28.80 | – / – / – "
        "| 28.98 / 29.20 / 29.00 | – / – / – | 4.9% / 4.7% / 4.5% | 0.010 (500, 2) |",
        f"| continued-mudd | {UNSCORED} / 4.546 / 4.550 | {UNSCORED} / 29.49 / 29.20 "
        f"| {UNSCORED} / +0.38 (0.009) / −0.10 (0.300) | {UNSCORED} / 29.47 / 29.30 "
        f"| {UNSCORED} / +0.06 (0.229) / +0.00 (0.500) | {UNSCORED} / 3.1% / 4.0% | – |"]


def test_without_a_row_in_two_runs_the_table_says_what_is_missing(tmp_path):
    assert replication_table(tmp_path) == f"No table of the second run yet (`{RUNS[1]}`).\n"
    publish(tmp_path, RUNS[0], ROWS, {"continued-linagg": scored(4.54, 29.03, 0.1, 0.2)})
    publish(tmp_path, RUNS[1], ROWS, {"converged-baseline-s1": scored(4.56, 29.2)})
    assert replication_table(tmp_path) == "No row is scored by two runs yet.\n"


def test_the_cli_writes_the_table_between_its_markers_only(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("before\n<!-- replication:begin -->\nold\n<!-- replication:end -->\nafter\n")
    cli_main(["--results", str(tmp_path), "--write", str(page)])
    assert read_block(page, "replication") == replication_table(tmp_path)
    assert page.read_text().startswith("before\n") and page.read_text().endswith("end -->\nafter\n")
