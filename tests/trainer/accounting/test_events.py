"""The event log on real files: per-node writers, and one reader that survives whatever a crash
or a disk leaves in a file."""

import json
import os
import subprocess
import sys

import pytest

from tests.jobs import ROOT
from trainer.accounting.events import (EventLog, LogStats, events_dir, log_beside, node_log_name,
                                       process_log, read_events)
from trainer.accounting.goodput import summarize


def _line(t, event, rank=0, **kw):
    return (json.dumps({"t": t, "event": event, "rank": rank, **kw}) + "\n").encode()


def _read(where):
    stats = LogStats()
    return list(read_events(where, stats)), stats


def test_a_line_that_is_not_utf8_is_skipped_and_counted(tmp_path):
    log = tmp_path / "events" / node_log_name(0)
    log.parent.mkdir()
    log.write_bytes(_line(1.0, "launch") + b"\xff\xfe\x00garbage\x81\n" + _line(2.0, "train_end"))
    events, stats = _read(log.parent)
    assert [e["event"] for e in events] == ["launch", "train_end"]
    assert stats.unreadable == 1 and stats.events == 2 and stats.files == 1
    assert stats.warning() == ("events: skipped 1 unreadable line(s) of 1 file(s) "
                               f"(first: {log.name} line 2)")


@pytest.mark.parametrize("line", [b"42", b"[1,2]", b'{"x":1}', b'"text"', b"null",
                                  b'{"t":"soon","event":"step","rank":0}',
                                  b'{"t":1e999,"event":"step","rank":0}',
                                  b'{"t":3,"event":7,"rank":0}', b'{"t":3,"event":"step","rank":true}',
                                  b'{"t":3,"event":"step","rank":0}',  # a step with no step number
                                  b'{"t":3,"event":"error","rank":0,"type":"E"}'])
def test_json_that_is_not_an_event_is_skipped_and_summarize_still_runs(tmp_path, line):
    log = tmp_path / node_log_name(0)
    log.write_bytes(_line(1.0, "launch") + _line(2.0, "train_start", step=0) + line + b"\n"
                    + _line(4.0, "step", step=1, dt=1.0) + _line(5.0, "train_end"))
    events, stats = _read(log)
    assert stats.unreadable == 1 and len(events) == 4
    r = summarize(events, max_steps=1, checkpoint_interval=0)
    assert r["steps_completed"] == 1 and r["faults"] == []


def test_a_new_writer_never_glues_its_event_onto_a_torn_line(tmp_path):
    """A crash mid-write leaves a line without its newline; the next process starts a new line,
    so no restart goes uncounted (each launch below is a job restart: a new launcher)."""
    log = tmp_path / "events" / node_log_name(0)
    for attempt in range(4):
        w = EventLog(log, 0)
        w.emit("launch", launcher_restart=0, launcher=f"start{attempt}")
        w.emit("train_start", step=attempt)
        w.emit("step", step=attempt + 1, dt=0.1)
        w.close()
        if attempt < 3:  # killed mid-line: part of an event, no newline
            with open(log, "ab") as f:
                f.write(b'{"t":1.5,"event":"ste')
    w = EventLog(log, 0)
    w.emit("train_end")
    assert log.read_bytes().count(b"\n") == 4 * 3 + 3 + 1  # every torn fragment ends its line
    events, stats = _read(log.parent)
    assert stats.unreadable == 3
    assert [e["event"] for e in events].count("launch") == 4
    r = summarize(events, max_steps=4, checkpoint_interval=0)
    assert r["restarts"] == 3 and len(r["faults"]) == 3
    assert {f["detection"] for f in r["faults"]} == {"job_restart"}


def test_a_short_write_starts_the_next_event_on_a_new_line(tmp_path):
    """A full disk can take part of a write; the same writer then begins its next line anew."""
    log = tmp_path / node_log_name(0)
    w = EventLog(log, 0)
    w.emit("launch")
    real_write = os.write
    os.write = lambda fd, data: real_write(fd, data[:7])
    try:
        w.emit("step", step=1, dt=1.0)
    finally:
        os.write = real_write
    w.emit("train_end")
    events, stats = _read(log)
    assert [e["event"] for e in events] == ["launch", "train_end"] and stats.unreadable == 1


def test_an_event_glued_onto_a_torn_fragment_is_kept(tmp_path):
    """A writer that could not know of another's torn line, or NUL bytes a crash left before an
    event: the event after the damage is read, the line counted as damaged."""
    log = tmp_path / node_log_name(0)
    log.write_bytes(b'{"t":1.0,"event":"ste' + _line(2.0, "launch") + b"\x00" * 64 + _line(3.0, "x"))
    events, stats = _read(log)
    assert [e["event"] for e in events] == ["launch", "x"] and stats.unreadable == 2


def test_an_endless_line_is_skipped_without_reading_it_whole(tmp_path):
    log = tmp_path / node_log_name(0)
    with open(log, "wb") as f:
        f.write(_line(1.0, "launch"))
        f.write(b"\x00" * (3 << 20) + b"\n")  # a disk's zeroed blocks: no newline for megabytes
        f.write(_line(2.0, "train_end"))
    events, stats = _read(log)
    assert [e["event"] for e in events] == ["launch", "train_end"] and stats.unreadable == 1


def test_files_are_merged_in_time_order_despite_small_disorder_within_one(tmp_path):
    d = tmp_path / "events"
    d.mkdir()
    # Two processes of node 0 stamped 2.0 and 2.1 but appended in the other order.
    (d / node_log_name(0)).write_bytes(_line(1.0, "a") + _line(2.1, "c") + _line(2.0, "b")
                                       + _line(9.0, "f"))
    (d / node_log_name(1)).write_bytes(_line(1.5, "a1", 2) + _line(5.0, "d", 2))
    (d / "job.jsonl").write_bytes(_line(6.0, "e", -1))
    (d / "notes.txt").write_text("not a log")
    events, stats = _read(d)
    assert [e["event"] for e in events] == ["a", "a1", "b", "c", "d", "e", "f"]
    assert stats.files == 3
    # More files than may be open at once: merged in passes, the same result.
    assert [e["event"] for e in read_events(d, fan_in=2)] == [e["event"] for e in events]


def test_merge_writes_one_log_and_refuses_a_directory_without_one(tmp_path):
    d = tmp_path / "run" / "events"
    d.mkdir(parents=True)
    (d / node_log_name(1)).write_bytes(_line(2.0, "b", 8) + b"\xff\n")
    (d / node_log_name(0)).write_bytes(_line(1.0, "a") + _line(3.0, "c"))
    proc = subprocess.run([sys.executable, "-m", "trainer.accounting.events", "merge", str(d)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    merged = tmp_path / "run" / "events.jsonl"
    assert [json.loads(x)["event"] for x in merged.read_text().splitlines()] == ["a", "b", "c"]
    assert "skipped 1 unreadable line" in proc.stderr
    assert log_beside(tmp_path / "run" / "results.json") == d
    (tmp_path / "empty").mkdir()
    proc = subprocess.run([sys.executable, "-m", "trainer.accounting.events", "merge",
                           str(tmp_path / "empty")], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "is not an events directory" in proc.stderr


def test_a_merged_log_stands_in_for_the_directory(tmp_path):
    (tmp_path / "events.jsonl").write_bytes(_line(1.0, "a"))
    assert log_beside(tmp_path / "results.json") == tmp_path / "events.jsonl"
    assert [e["event"] for e in read_events(log_beside(tmp_path / "results.json"))] == ["a"]


@pytest.mark.parametrize("world", [2, 64])
def test_a_rank_writes_one_file_of_its_node_whatever_the_world_size(tmp_path, world):
    """The per-rank cost of an event: one descriptor opened once, for its node's file alone; the
    directory holds one file per node, never one per rank."""
    per_node = min(world, 8)
    opened: dict[int, list[str]] = {}
    for rank in range(world):
        def opener(path, flags, mode, rank=rank):
            assert flags & os.O_APPEND
            opened.setdefault(rank, []).append(path)
            return os.open(path, flags, mode)

        env = {"RANK": str(rank), "NVRX_EKS_NODE_RANK": str(rank // per_node)}
        log = process_log(tmp_path, env, opener=opener)
        for step in range(20):
            log.emit("step", step=step, dt=0.1)
        log.close()
    nodes = world // per_node
    assert {rank: len(paths) for rank, paths in opened.items()} == {r: 1 for r in range(world)}
    assert all(paths == [str(events_dir(tmp_path) / node_log_name(rank // per_node))]
               for rank, paths in opened.items())
    assert sorted(p.name for p in events_dir(tmp_path).iterdir()) == \
        [node_log_name(n) for n in range(nodes)]
    events, stats = _read(events_dir(tmp_path))
    assert len(events) == 20 * world and stats.unreadable == 0


def _damaged_run(run_dir):
    """A finished run's log with a line a disk mangled in the middle."""
    log = events_dir(run_dir) / node_log_name(0)
    log.parent.mkdir(parents=True)
    log.write_bytes(_line(1.0, "launch") + _line(2.0, "train_start", step=0)
                    + _line(3.0, "step", step=1, dt=1.0) + b"\xc3\x28\xa0\xa1 not utf-8\n"
                    + _line(3.5, "error", 1, type="RuntimeError", message="boom", fatal=True)
                    + _line(4.0, "step", step=2, dt=1.0) + _line(5.0, "train_end"))


def test_rank_0_writes_results_from_a_damaged_log(tmp_path, capsys):
    from trainer.cli import write_results
    from trainer.config import parse_args

    _damaged_run(tmp_path)
    cfg = parse_args(["--max_steps", "2", "--results_path", str(tmp_path / "results.json")])
    write_results(cfg, {"param_sha256": "0" * 64, "steps_completed": 2})
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["steps_completed"] == 2 and results["event_log"]["unreadable_lines"] == 1
    assert "skipped 1 unreadable line(s)" in capsys.readouterr().err


def test_the_local_runner_names_the_cause_from_a_damaged_log(tmp_path):
    from devtools.local import _cause

    _damaged_run(tmp_path)
    assert _cause(events_dir(tmp_path)) == "rank 1: RuntimeError: boom"
    assert _cause(tmp_path / "nowhere") == "no error was recorded; see the log above"
