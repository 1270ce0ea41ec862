"""A real run whose event log a disk damages mid-run still ends with its results."""

import os

from tests.jobs import INTERVAL, STEPS, events, results, start_local, wait_for
from trainer.accounting.events import events_dir, node_log_name


def test_a_line_damaged_mid_run_costs_that_line_only(cache_dir, reference, tmp_path):
    ref = reference()
    run_dir = tmp_path / "run"
    job = start_local(cache_dir, "baseline", run_dir, "--max_steps", str(STEPS),
                      "--checkpoint_interval", str(INTERVAL))
    wait_for(lambda: sum(e["event"] == "step" for e in events(run_dir)) >= 3, timeout=180,
             what="three steps")
    fd = os.open(events_dir(run_dir) / node_log_name(0), os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"\xff\xfe\x00 not an event \xc3\x28\n")  # one whole line, as appends are
    os.close(fd)
    assert job.wait(timeout=300) == 0, (run_dir / "test-output.log").read_text()[-3000:]
    res = results(run_dir)
    assert res["event_log"]["unreadable_lines"] == 1 and res["event_log"]["files"] == 1
    assert res["param_sha256"] == ref["param_sha256"] and res["steps_completed"] == STEPS
    assert "rank 0: warning: events: skipped 1 unreadable line(s)" in \
        (run_dir / "test-output.log").read_text()
