"""What `pomt offline` prints: a summary of at most 15 lines with the rejected candidates counted by reason and
the reason for the schedule once, every row with --verbose; options in help panels, in the panels' order."""

import re

import pytest

from pomt.cli.offline import MAX_LINES, fit_summary, reason_head
from pomt.errors import CalibrationError
from pomt.offline.choose import check_folder_resolves
from pomt.offline.config import SAMPLE_CAP, OfflineConfig, sample_size
from pomt.options import PANELS

from conftest import DATA, run_in_process

REPLAY = ("offline", "--replay", str(DATA / "deit_tiny_bs1_shuffled.csv"), "--no-progress", "--passes", "2",
          "--confirm-rounds", "3")


@pytest.fixture(scope="module")
def summaries(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    short = run_in_process(*REPLAY, "--output-dir", str(out / "short"))
    full = run_in_process(*REPLAY, "--output-dir", str(out / "full"), "--verbose")
    assert short.returncode == 0 and full.returncode == 0, short.stderr + full.stderr
    return short.stdout.splitlines(), full.stdout.splitlines()


def test_the_summary_is_at_most_15_lines_and_folds_rejected_candidates_by_reason(summaries):
    short, full = summaries
    assert len(short) <= 15, "\n".join(short)
    steps = next(line for line in short if line.startswith("steps"))
    rejected = int(re.search(r"(\d+) candidates not", steps).group(1))
    assert rejected > 0  # the trace leaves candidates that do not confirm
    counted = [int(n) for n in re.findall(r"(?:: |, )(\d+) ", steps.split("candidates not", 1)[1])]
    assert sum(counted) == rejected  # every rejected candidate counted under one reason
    assert len(full) >= len(short) + rejected  # --verbose lists each rejected candidate on its own row


def test_the_schedule_reason_is_printed_once(summaries):
    short, _ = summaries
    why = next(line for line in short if line.startswith("why")).split(None, 1)[1]
    assert sum(why in line for line in short) == 1
    assert not any(line.startswith("schedule") and "(policy" in line for line in short)


def test_the_files_are_one_line_by_default_and_each_with_verbose(summaries):
    short, full = summaries
    assert sum(line.startswith("wrote") for line in short) == 1
    assert sum(line.startswith("wrote") for line in full) >= 3  # schedule, curve, plot


@pytest.mark.parametrize("summary", range(9, 15))
@pytest.mark.parametrize("notes", range(4))
def test_the_summary_fits_whatever_the_count_of_steps_and_notes(summary, notes):
    lines = [f"line {i}" for i in range(summary)]
    without_steps = lines[:summary - 3]  # three step rows
    fitted = fit_summary(lines, without_steps, [f"note {i}" for i in range(notes)], ["wrote"])
    assert len(fitted) <= MAX_LINES
    assert fitted[-1] == "wrote" and fitted[0] == "line 0"
    assert bool(notes) == any(line.startswith("note") for line in fitted)  # a note is never dropped unsaid
    if summary + notes + 1 <= MAX_LINES:
        assert fitted == lines + [f"note {i}" for i in range(notes)] + ["wrote"]


@pytest.mark.parametrize(("reason", "head"), [
    ("not significant (p = 0.2 >= 0.01, 6 rounds)", "not significant"),
    ("not examined: the visit budget is spent", "not examined: the visit budget is spent"),
    ("smaller than the minimum step (1.2% < 3.0%)", "smaller than the minimum step"),
    ("no candidate: its paired rounds put it 1.1 standard errors from the trend", "no candidate"),
])
def test_a_rejected_candidate_is_counted_by_its_reason_without_numbers(reason, head):
    assert reason_head(reason) == head


def test_offline_help_lists_its_options_in_panels_in_order():
    result = run_in_process("offline", "--help")
    assert result.returncode == 0
    shown = [panel for panel in PANELS if re.search(rf"─ {re.escape(panel)} ─", result.stdout)]
    assert shown == list(PANELS)
    positions = [result.stdout.index(f"─ {panel} ─") for panel in shown]
    assert positions == sorted(positions)


def test_the_default_calibration_sample_is_the_whole_folder_up_to_the_cap():
    assert sample_size(OfflineConfig(), 1_200) == 1_200
    assert sample_size(OfflineConfig(), 3 * SAMPLE_CAP) == SAMPLE_CAP
    assert sample_size(OfflineConfig(accuracy_samples=300), 1_200) == 300


def test_a_folder_large_enough_runs_the_defaults_and_a_smaller_one_says_what_it_allows():
    check_folder_resolves(OfflineConfig(), 1_000, 1.0, seed=0)  # 666 held out certify 1 point for 4 finalists
    with pytest.raises(CalibrationError) as refused:
        check_folder_resolves(OfflineConfig(), 600, 1.0, seed=0)
    message = str(refused.value)
    assert message.startswith("the whole folder: 600 calibration images, 400 of them held out; 400 held-out images "
                              "cannot certify a drop within 1 points at 95% for 4 finalists")
    assert "--max-accuracy-drop" in message and "fewer --finalists" in message and "\n" not in message
