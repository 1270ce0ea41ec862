"""The report: table values, Markdown, the timeline PNG and bad input, on hand-made runs."""

import json
import shutil
import subprocess
import sys

import pytest

from tests.jobs import ROOT
from devtools.report import (ReportError, main, plot_timeline, render_markdown, render_text,
                             table_rows, timeline)
from trainer.accounting.goodput import summarize

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _ev(t, event, rank=0, **kw):
    return {"t": t, "event": event, "rank": rank, **kw}


def one_fault_events(t0=1000.0):
    """10 steps of 1 s; an exception before step 7; resume from the step-3 checkpoint."""
    ev = [_ev(0.0, "launch"), _ev(0.0, "launch", 1), _ev(2.0, "train_start", step=0),
          _ev(2.0, "train_start", 1, step=0)]
    ev += [_ev(2.0 + s, "step", step=s, dt=1.0) for s in range(1, 7)]
    ev += [_ev(5.0, "ckpt_save", step=3, blocking_s=0.5, bytes=100),
           _ev(8.5, "fault", 1, step=7, type="exception"), _ev(9.5, "abort"),
           _ev(10.0, "attempt_start"), _ev(11.0, "ckpt_load", step=3, tier="durable"),
           _ev(11.0, "train_start", step=3), _ev(11.1, "train_start", 1, step=3)]
    ev += [_ev(11.0 + (s - 3), "step", step=s, dt=1.0) for s in range(4, 11)]
    ev += [_ev(18.0, "train_end", steps_completed=10)]
    return [{**e, "t": e["t"] + t0} for e in ev]


def write_run(run_dir, mode="inprocess", events=None):
    """A run directory as the trainer leaves it: the events directory beside results.json."""
    events = one_fault_events() if events is None else events
    (run_dir / "events").mkdir(parents=True)
    (run_dir / "events" / "node-00000.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    results = {"mode": mode, **summarize(events, max_steps=10, checkpoint_interval=3)}
    (run_dir / "results.json").write_text(json.dumps(results))
    return run_dir / "results.json"


def test_table_rows_come_from_results(tmp_path):
    results = json.loads(write_run(tmp_path / "a").read_text())
    (row,) = table_rows([results])
    assert row["label"] == "inprocess" and row["faults"] == 1 and row["steps_lost"] == 3
    assert row["recovery_seconds_mean"] == pytest.approx(3.5)
    assert row["ckpt_blocking_seconds"] == pytest.approx(0.5)
    assert row["wall_seconds"] == pytest.approx(18.0)
    for key in ("training_goodput_pct", "infra_goodput_pct", "training_efficiency_pct"):
        assert row[key] == results[key]  # copied as trainer.accounting.goodput computed them
    assert table_rows([results], ["async"])[0]["label"] == "async"
    with pytest.raises(ReportError, match="2 labels for 1"):
        table_rows([results], ["a", "b"])


def test_unknown_values_print_as_a_dash():
    rows = table_rows([{"mode": "baseline", "steps_completed": 5, "wall_seconds": 2.0},
                       {"mode": "x", "steps_completed": 5, "wall_seconds": 2.0,
                        "faults": [{"steps_lost": 2}, {"steps_lost": None}]}])
    assert rows[0]["faults"] is None and rows[1]["faults"] == 2 and rows[1]["steps_lost"] is None
    lines = render_text(rows).splitlines()
    assert lines[0].split()[0] == "run" and set(lines[1]) == {"-", " "}
    assert lines[2].split() == ["baseline", "-", "-", "-", "-", "-", "-", "-", "2.0"]
    assert lines[3].split() == ["x", "-", "-", "-", "2", "-", "-", "-", "2.0"]
    assert len({len(line) for line in lines[:2]}) == 1  # header and rule line up


def test_markdown_table(tmp_path):
    results = json.loads(write_run(tmp_path / "a").read_text())
    md = render_markdown(table_rows([results, results], ["sync", "async"])).splitlines()
    assert len(md) == 4 and md[0].startswith("| run | training goodput % |")
    assert md[1].startswith("| :-- | --: |")
    assert md[2].split(" | ")[0] == "| sync" and md[3].split(" | ")[0] == "| async"
    assert (f"| {results['training_goodput_pct']:.1f} | {results['infra_goodput_pct']:.1f} | 3.5 | 1 "
            f"| 3 | 0.50 | {results['training_efficiency_pct']:.2f} | 18.0 |") in md[2]


def test_timeline_breaks_at_restarts_and_times_recovery():
    events = one_fault_events()
    tl = timeline(events, summarize(events, max_steps=10, checkpoint_interval=3)["faults"])
    assert [steps for _, steps in tl.segments] == [[0, 1, 2, 3, 4, 5, 6], [3, 4, 5, 6, 7, 8, 9, 10]]
    assert tl.segments[0][0][0] == pytest.approx(2.0)  # seconds since the first launch
    assert tl.faults == [(pytest.approx(8.5), 7, "exception")]
    assert tl.recoveries == [(pytest.approx(8.5), pytest.approx(12.0))]  # as goodput's 3.5 s


def test_main_writes_table_markdown_and_png(tmp_path, capsys):
    paths = [str(write_run(tmp_path / m.replace("+", "-"), m)) for m in
             ("baseline", "ft_launcher", "inprocess", "ft_launcher+inprocess")]
    out = tmp_path / "report"
    assert main([*paths, "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in printed[2:6]] == ["baseline", "ft_launcher", "inprocess",
                                                          "ft_launcher+inprocess"]
    assert len((out / "report.md").read_text().splitlines()) == 6
    png = out / "timeline.png"
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(png).shape
    assert width > 800 and height > 4 * 150  # four stacked panels


def test_plot_timeline_needs_runs(tmp_path):
    with pytest.raises(ReportError):
        plot_timeline([], tmp_path / "t.png")


def _report(*args):
    return subprocess.run([sys.executable, "-m", "devtools.report", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("case, fragment", [
    ("missing", "no such file"),
    ("not_json", "not JSON"),
    ("other_json", "not a results.json (no mode, steps_completed, wall_seconds)"),
    ("no_events", "no events"),
    ("labels", "--labels has 2 labels for 1"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, case, fragment):
    path = tmp_path / "results.json"
    extra = []
    if case == "not_json":
        path.write_text("{oops")
    elif case == "other_json":
        path.write_text('{"hello": 1}')
    elif case == "no_events":
        path = write_run(tmp_path / "run")
        shutil.rmtree(tmp_path / "run" / "events")
        extra = ["--out", str(tmp_path / "out")]
    elif case == "labels":
        path = write_run(tmp_path / "run")
        extra = ["--labels", "a,b"]
    proc = _report(str(path), *extra)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m devtools.report: error: ")
    assert fragment in lines[0]
    assert not (tmp_path / "out").exists()


def test_demo_help_and_bad_steps():
    proc = subprocess.run([sys.executable, "-m", "devtools.demo", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--steps" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "devtools.demo", "--steps", "10"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--steps 10 must be at least 40" in proc.stderr
