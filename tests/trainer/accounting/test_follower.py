"""Reading the event log while it is written (`Follower`), and the goodput pass asked along the
way (`Goodput`): what a live view shows is what results.json says at the end."""

import json
import random

import pytest

from trainer.accounting.events import Follower, LogStats, node_log_name, read_events
from trainer.accounting.goodput import Goodput, summarize


def _line(t, event, rank=0, **kw):
    return (json.dumps({"t": t, "event": event, "rank": rank, **kw}) + "\n").encode()


def _append(path, data: bytes):
    with path.open("ab") as f:
        f.write(data)


def test_an_event_appears_once_its_line_is_complete_and_its_window_has_passed(tmp_path):
    log = tmp_path / node_log_name(0)
    log.write_bytes(b"")
    f = Follower([log], window=5.0)
    line = _line(100.0, "launch")
    _append(log, line[:10])
    assert f.poll(now=200.0) == []  # half a line: a writer may be mid-line
    _append(log, line[10:])
    assert f.poll(now=104.0) == []  # complete, but a later line may still sort before it
    assert [e["event"] for e in f.poll(now=105.0)] == ["launch"]
    _append(log, _line(101.0, "train_start", step=0))
    assert [e["event"] for e in f.poll(final=True, now=0.0)] == ["train_start"]
    assert f.poll(final=True) == []


def test_a_last_line_without_its_newline_counts_only_in_a_final_poll(tmp_path):
    log = tmp_path / node_log_name(0)
    log.write_bytes(_line(1.0, "launch").rstrip(b"\n"))
    f = Follower([log])
    assert f.poll(now=100.0) == []
    assert [e["event"] for e in f.poll(final=True)] == ["launch"]


def test_following_a_growing_directory_yields_what_one_read_of_it_yields(tmp_path):
    """Three node files, each line appended within 2 s of its stamp (processes of one node stamp
    and append slightly apart), damaged lines among them, polled in small chunks while they
    grow: the same events in the same order as one `read_events` at the end."""
    rng = random.Random(7)
    d = tmp_path / "events"
    d.mkdir()
    f = Follower(d, stats=LogStats(), chunk=4096)
    seen = []
    for i in range(600):
        written_at = i * 0.1
        node = rng.randrange(3)
        stamp = written_at - rng.uniform(0, 2.0)
        line = _line(stamp, "step", rank=node, step=i, dt=0.1)
        if rng.random() < 0.02:
            line = b"\xff not an event\n" + line
        _append(d / node_log_name(node), line)
        if rng.random() < 0.3:
            seen += f.poll(now=written_at)
    seen += f.poll(final=True)
    while f.behind:
        seen += f.poll(final=True)
    stats = LogStats()
    assert seen == list(read_events(d, stats))
    assert f.stats.unreadable == stats.unreadable > 0 and f.stats.files == 3


def test_a_small_chunk_holds_back_what_an_unread_file_may_precede(tmp_path):
    d = tmp_path / "events"
    d.mkdir()
    (d / node_log_name(0)).write_bytes(b"".join(_line(float(t), "step", step=t, dt=1.0)
                                               for t in range(0, 200, 2)))
    (d / node_log_name(1)).write_bytes(b"".join(_line(float(t), "step", rank=1, step=t, dt=1.0)
                                               for t in range(1, 200, 2)))
    f = Follower(d, chunk=256)
    out = []
    for _ in range(1000):
        out += f.poll(final=True)
        if not f.behind:
            break
    assert [e["t"] for e in out] == [float(t) for t in range(200)]


def test_a_line_longer_than_any_event_is_skipped_and_counted(tmp_path):
    log = tmp_path / node_log_name(0)
    log.write_bytes(_line(1.0, "launch") + b"x" * 5000 + b"\n" + _line(2.0, "train_end"))
    f = Follower([log], chunk=1024)
    out = []
    for _ in range(20):
        out += f.poll(final=True)
    assert [e["event"] for e in out] == ["launch", "train_end"]
    assert f.stats.unreadable == 1


def _timeline():
    ev = [{"t": 0.0, "event": "launch", "rank": 0}, {"t": 1.0, "event": "train_start", "rank": 0, "step": 0}]
    ev += [{"t": 1.0 + s, "event": "step", "rank": 0, "step": s, "dt": 1.0} for s in range(1, 9)]
    ev += [{"t": 5.5, "event": "ckpt_commit", "rank": 0, "step": 4, "write_s": 0.7, "bytes": 10}]
    ev += [{"t": 9.5, "event": "fault", "rank": 1, "step": 9, "type": "exception"},
           {"t": 10.0, "event": "attempt_start", "rank": 0, "iteration": 1},
           {"t": 11.0, "event": "train_start", "rank": 0, "step": 8}]
    ev += [{"t": 11.0 + s - 8, "event": "step", "rank": 0, "step": s, "dt": 1.0} for s in range(9, 13)]
    ev += [{"t": 15.5, "event": "train_end", "rank": 0}]
    return sorted(ev, key=lambda e: e["t"])


def test_the_pass_asked_along_the_way_ends_with_the_figures_of_one_pass():
    events = _timeline()
    live = Goodput(max_steps=12, checkpoint_interval=4)
    during = []
    for e in events:
        live.feed(e)
        during.append(live.summary())
    assert live.summary() == summarize(events, 12, 4)
    # While the failure was in progress it was an entry without its recovery; after, with it.
    in_progress = during[events.index(next(e for e in events if e["event"] == "attempt_start"))]
    assert in_progress["faults"][0]["recovery_seconds"] is None
    assert during[-1]["faults"][0]["recovery_seconds"] == pytest.approx(12.0 - 9.5)
    assert during[-1]["checkpoint"]["last_step"] == 4
    assert during[-1]["checkpoint"]["last_write_seconds"] == 0.7
    assert not Goodput(1, 0).ended and live.ended
