"""`nvrx-eks plan`: its arithmetic by hand, the storage it recommends, its recovery estimates,
and what the command prints and refuses."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from config import fsx, load_profile
from config.contract import TERMINATION_GRACE_FLOOR_S, RecoveryMode
from config.grace import termination_grace_seconds
from scripts import fsx_metadata, recovery_estimate
from scripts import plan as planning
from scripts import spares as sparing
from scripts.nvrx_eks import main

PARAMS_8B = 8_030_261_248  # Llama 3.1 8B: 2 x 128256 x 4096 embeddings + 32 layers + final norm
CHECKPOINT_8B = PARAMS_8B * 12


def test_plan_arithmetic_by_hand() -> None:
    """llama3.1-8b on 2 p5 (16 ranks), FSx SCRATCH_2 1200 GiB, checkpoint every 500 steps."""
    plan = planning.make_plan(load_profile("p5"))
    (column,) = plan.columns
    assert plan.parameters == PARAMS_8B and plan.checkpoint_bytes_total == CHECKPOINT_8B
    assert column.ranks == 16 and column.checkpoint_bytes_per_rank == CHECKPOINT_8B // 16
    # SCRATCH_2 writes 100 MB/s and reads 200 MB/s per TiB: 1200 GiB = 1.17 TiB
    assert plan.current.write_mb_s == pytest.approx(117.1875)
    assert plan.current.read_mb_s == pytest.approx(234.375)
    assert plan.write_seconds(plan.current) == pytest.approx(CHECKPOINT_8B / 117.1875e6)  # 822 s
    assert plan.min_step_seconds(plan.current) == pytest.approx(plan.write_seconds(plan.current) / 500)
    # Tiers memory,node,peer on 2 nodes with durable checkpoints: 2 alternating own slots, one
    # kept for the peer, one read by the durable writer, and 2 replica slots; no staging buffer.
    assert column.snapshot_bytes_per_rank == 6 * column.checkpoint_bytes_per_rank
    assert column.host_bytes_per_node == 8 * 6 * column.checkpoint_bytes_per_rank
    # Without a step time nothing says SCRATCH_2 falls behind, and 3 checkpoints fit.
    assert plan.needed_write_mb_s is None and plan.recommended == plan.current
    # on SIGTERM: the write with a quarter more, 60 s for the rest of the stop
    assert plan.termination_grace_seconds == math.ceil(plan.write_seconds(plan.current) * 1.25 + 60)


def test_a_small_checkpoints_grace_period_is_the_floor() -> None:
    assert termination_grace_seconds(5.0) == TERMINATION_GRACE_FLOOR_S
    assert termination_grace_seconds(1000.0) == 1310


def test_plan_scales_with_nodes() -> None:
    plan = planning.make_plan(load_profile("p5"), [16, 1024])
    assert [c.ranks for c in plan.columns] == [128, 8192]
    assert [c.checkpoint_bytes_per_rank for c in plan.columns] == [-(-CHECKPOINT_8B // 128),
                                                                    -(-CHECKPOINT_8B // 8192)]
    assert plan.columns[1].checkpoint_ops == fsx_metadata.checkpoint(8192, keep=2)
    assert plan.columns[1].resume_ops == fsx_metadata.resume(8192, keep=2)


def test_the_write_bandwidth_a_step_time_needs() -> None:
    plan = planning.make_plan(load_profile("p5"), step_seconds=1.0)
    assert plan.interval_seconds == 500
    assert plan.needed_write_mb_s == pytest.approx(CHECKPOINT_8B / 1e6 / 500)  # 193 MB/s
    # PERSISTENT_2 at 125 would need 1581 GiB (2400); at 250, 1200 GiB give 293 MB/s.
    assert plan.recommended == fsx.FileSystem("PERSISTENT_2", 1200, 250)


def test_the_least_persistent_capacity_then_the_lowest_tier() -> None:
    # 20 GB/s: 1000 MB/s/TiB needs 20,480 GiB, rounded up to the next 2400 step
    assert planning.smallest_persistent(20_000, floor=0) == fsx.FileSystem("PERSISTENT_2", 21600, 1000)
    # room binds: 10,000 GiB -> 12,000 GiB, where even 125 MB/s/TiB writes 1465 MB/s
    assert planning.smallest_persistent(500, floor=10_000) == fsx.FileSystem("PERSISTENT_2", 12000, 125)


def test_scratch_2_grows_while_only_room_is_short_and_persistent_2_stays_persistent() -> None:
    current = fsx.FileSystem("SCRATCH_2", 1200)
    assert planning.recommend(current, None, floor=1885) == fsx.FileSystem("SCRATCH_2", 2400)
    assert planning.recommend(current, 100, floor=0) == current
    assert planning.recommend(current, 300, floor=0) == fsx.FileSystem("PERSISTENT_2", 1200, 500)
    slow = fsx.FileSystem("PERSISTENT_2", 1200, 125)
    assert planning.recommend(slow, 100, floor=1885) == fsx.FileSystem("PERSISTENT_2", 2400, 125)
    # keep_checkpoints 20: 21 checkpoints of 96.4 GB are 1885 GiB
    plan = planning.make_plan(load_profile("p5", ["trainer.keep_checkpoints=20"]))
    assert plan.recommended == fsx.FileSystem("SCRATCH_2", 2400)
    _, warnings = planning.report(plan, "p5")
    assert warnings == [
        "SCRATCH_2, 1,200 GiB cannot hold 21 checkpoints of 96.4 GB (1,885 GiB)",
        "SCRATCH_2, 2,400 GiB does: set storage: deployment_type: SCRATCH_2, fsx_capacity_gib: "
        "2400, or lower trainer.keep_checkpoints",
    ]


@pytest.mark.parametrize("gib, iops", [(1200, 1500), (2400, 3000), (4800, 6000), (9600, 6000),
                                       (12000, 12000), (45600, 12000), (48000, 24000),
                                       (1_200_000, 192000)])
def test_automatic_metadata_iops_by_capacity(gib, iops) -> None:
    assert fsx.FileSystem("PERSISTENT_2", gib, 125).metadata_iops == iops
    assert fsx.FileSystem("SCRATCH_2", gib).metadata_iops is None  # AWS publishes none


def test_valid_sizes_and_persistent_throughput() -> None:
    sizes = [fsx.capacity_at_least(g) for g in (1, 1200, 1201, 2400, 2401)]
    assert sizes == [1200, 1200, 2400, 2400, 4800]
    p2 = fsx.FileSystem("PERSISTENT_2", 4800, 500)
    assert p2.write_mb_s == p2.read_mb_s == 4800 / 1024 * 500
    with pytest.raises(ValueError, match="fsx_capacity_gib 3600 is not a valid"):
        fsx.FileSystem("SCRATCH_2", 3600)


def test_metadata_iops_seconds_by_hand() -> None:
    """AWS's rates per Metadata IOPS: 2 creates, opens or closes, 1 delete, 0.1 directory
    creates; stats and fsyncs counted as opens, renames as deletes."""
    # first rank: mkdir 10, stale-marker unlink 1, 2 creates 1, 4 fsyncs 2, 2 renames 2,
    # 2 directory opens 1, 4 closes 2
    assert fsx_metadata.shard_save(makes_directory=True).iops_seconds() == pytest.approx(19)
    # the others find the directory: a lookup and a stat, 1, instead of the mkdir
    assert fsx_metadata.shard_save(makes_directory=False).iops_seconds() == pytest.approx(10)


def test_recovery_estimates_by_hand() -> None:
    fs = fsx.FileSystem("SCRATCH_2", 1200)
    tiers = ("memory", "node", "peer")
    shard = CHECKPOINT_8B // 16
    memory = recovery_estimate.estimate(RecoveryMode.FT_LAUNCHER_INPROCESS, tiers, shard,
                                        CHECKPOINT_8B, 2, fs)
    # without its restore: median of 1.73-0.381, 1.37-0.393, 2.03-0.328; restored at 7.41 GB
    # per median 0.381 s
    assert memory.tier == "memory"
    assert memory.measured_s == pytest.approx(1.73 - 0.381)
    assert memory.restore_s == pytest.approx(shard / (7.41e9 / 0.381))
    durable = recovery_estimate.estimate(RecoveryMode.BASELINE, tiers, shard, CHECKPOINT_8B, 2, fs)
    assert durable.measured_s == pytest.approx(statistics.median([28.94 - 0.241, 36.84 - 0.499]
                                                                 + [41.58 - 0.252, 46.80 - 3.383]))
    assert durable.restore_s == pytest.approx(CHECKPOINT_8B / 234.375e6)  # 411 s, the file system
    # without the tiers every mode reads the durable checkpoint
    node = recovery_estimate.estimate(RecoveryMode.FT_LAUNCHER, (), shard, CHECKPOINT_8B, 2, fs)
    assert node.tier == "durable" and node.restore_s == pytest.approx(durable.restore_s)


def test_a_durable_read_is_bound_by_one_client_when_the_file_system_is_fast() -> None:
    fast = fsx.FileSystem("PERSISTENT_2", 480_000, 1000)  # 469 GB/s
    one_node = recovery_estimate.durable_read_s(CHECKPOINT_8B, 1, fast)
    assert one_node == pytest.approx(CHECKPOINT_8B / 12.5e9)
    assert recovery_estimate.durable_read_s(CHECKPOINT_8B, 64, fast) == pytest.approx(
        CHECKPOINT_8B / (fast.read_mb_s * 1e6))


def test_plan_prints_one_table_and_says_what_keeps_up(outputs: Path, capsys) -> None:
    assert main(["plan", "--profile", "p5", "--nodes", "2,16,128,1024", "--step_seconds", "1"]) == 0
    out = capsys.readouterr().out
    table = out.split("\n\n")[1].splitlines()
    assert table[0].split() == ["2", "nodes", "16", "nodes", "128", "nodes", "1,024", "nodes"]
    ops = next(line for line in table if line.startswith("FSx metadata operations per checkpoint"))
    assert ops.split()[-4:] == [f"{fsx_metadata.checkpoint(n * 8, 2).all_ranks.total:,}"
                                for n in (2, 16, 128, 1024)]
    assert any(line.startswith("  baseline (durable)") for line in table)
    assert ("warning: SCRATCH_2, 1,200 GiB cannot keep up: a checkpoint of 96.4 GB every 500 s "
            "needs 193 MB/s, it writes 117 MB/s (one checkpoint takes 822 s)") in out
    assert ("warning: PERSISTENT_2 at 250 MB/s/TiB, 1,200 GiB does: set storage: deployment_type: "
            "PERSISTENT_2, throughput_mb_s_per_tib: 250, fsx_capacity_gib: 1200, or raise "
            "trainer.checkpoint_interval") in out
    assert main(["plan", "--profile", "p5", "--step_seconds", "2"]) == 0  # 822 s of 1000 s
    assert "warning" not in capsys.readouterr().out


def test_plan_warns_when_the_metadata_servers_fall_behind(outputs: Path, capsys) -> None:
    # a checkpoint every 5 s: 19.3 GB/s, PERSISTENT_2 at 1000 with 21,600 GiB, 12,000 Metadata
    # IOPS; 8,192 ranks' checkpoint keeps them busy longer than that
    plan = planning.make_plan(load_profile("p5"), [1024], step_seconds=0.01)
    assert plan.recommended == fsx.FileSystem("PERSISTENT_2", 21600, 1000)
    busy = fsx_metadata.checkpoint(8192, 2).all_ranks.iops_seconds() / 12000
    assert 5 < busy < 10
    assert main(["plan", "--profile", "p5", "--nodes", "1024", "--step_seconds", "0.01"]) == 0
    assert (f"warning: at 1,024 nodes the metadata servers cannot keep up: a checkpoint keeps "
            f"12,000 Metadata IOPS busy {busy:.1f} s") in capsys.readouterr().out


@pytest.mark.parametrize("nodes, message", [
    ("0", "--nodes 0 must be at least 1"),
    ("2,-1", "--nodes -1 must be at least 1"),
    ("2,x", "--nodes '2,x' must be node counts, e.g. 16 or 2,16,128,1024"),
])
def test_plan_refuses_bad_node_counts(nodes, message, capsys) -> None:
    assert main(["plan", "--profile", "p5", "--nodes", nodes]) == 2
    assert capsys.readouterr().err.strip() == f"nvrx-eks: error: {message}"


# --- hot spares: cost against the goodput they save (scripts.spares) ---------------------------------
def test_the_default_failure_rate_is_llama3s_hardware_interruptions() -> None:
    """419 interruptions in 54 days on 16,384 GPUs, 78 % hardware: 326.82 / 884,736 GPU-days."""
    assert sparing.DEFAULT_FAILURE_RATE == pytest.approx(419 * 0.78 / (54 * 16_384) * 1000)
    assert sparing.DEFAULT_FAILURE_RATE == pytest.approx(0.36940, abs=1e-5)


def test_spares_arithmetic_by_hand() -> None:
    """p5 (8 GPUs, $55.04 an hour), one spare, 1,024 training nodes at the default rate."""
    plan = sparing.make_spares_plan(load_profile("p5"), [1024], spares=1)
    (col,) = plan.columns
    assert plan.replacement_s == 50 + 10 + 450 + 450 == 960  # 16 min
    # ft_launcher+inprocess: the collective timeout min(60, 90 x 2/3) = 60 s, then ft_launcher's
    # measured restart without its restore: the median of 8.43-0.216, 7.12-0.209, 6.54-0.196, 6.16-0.204
    measured = statistics.median([8.43 - 0.216, 7.12 - 0.209, 6.54 - 0.196, 6.16 - 0.204])
    assert plan.with_spare_s == pytest.approx(60 + measured)  # 66.6 s
    per_day = 0.369397 * 8 * 1024 / 1000  # 3.026 failures a day
    assert col.failures_per_day == pytest.approx(per_day, rel=1e-5)
    # nodes in replacement: 3.026 / 86,400 x 960 = 0.0336; a failure finds none free: 1 - e^-0.0336
    mean = per_day / 86_400 * 960
    assert col.no_spare_probability == pytest.approx(1 - math.exp(-mean), rel=1e-5)  # 3.3 %
    assert col.idle_node_hours_per_day_without == pytest.approx(per_day * 960 / 3600 * 1024, rel=1e-5)  # 826
    p = col.no_spare_probability
    with_spare = per_day * (p * 960 + (1 - p) * plan.with_spare_s) / 3600 * 1024  # 82.8
    assert col.idle_node_hours_per_day_with == pytest.approx(with_spare, rel=1e-5)
    saved = (826.33 - 82.78) / 24 * 55.04  # about $1,705 an hour, against $55.04 for the spare
    assert col.saved_per_hour(55.04) == pytest.approx(saved, rel=1e-3)
    assert plan.cost_per_hour == 55.04


def test_where_one_spare_pays_for_itself() -> None:
    """Saved per hour ~ rate x n^2 x (960 - 66.6) s x price: about 180 p5 nodes at the default."""
    plan = sparing.make_spares_plan(load_profile("p5"), spares=1)
    n = plan.break_even_nodes
    price = plan.node_price
    col = lambda nodes: sparing.column(nodes, 8, 1, sparing.DEFAULT_FAILURE_RATE, 960,  # noqa: E731
                                       plan.with_spare_s)
    assert col(n).saved_per_hour(price) >= price > col(n - 1).saved_per_hour(price)
    assert 150 < n < 200
    # ten times the failure rate: sqrt(10) times fewer nodes
    tenfold = sparing.make_spares_plan(load_profile("p5"), spares=1, failure_rate=10 * sparing.DEFAULT_FAILURE_RATE)
    assert tenfold.break_even_nodes == pytest.approx(n / math.sqrt(10), rel=0.05)


def test_more_spares_leave_fewer_failures_without_one() -> None:
    assert sparing.poisson_at_least(0, 0.5) == 1.0
    assert sparing.poisson_at_least(1, 0.5) == pytest.approx(1 - math.exp(-0.5))
    assert sparing.poisson_at_least(2, 0.5) == pytest.approx(1 - math.exp(-0.5) * 1.5)
    one, two = (sparing.make_spares_plan(load_profile("p5"), [4096], spares=k).columns[0] for k in (1, 2))
    assert two.no_spare_probability < one.no_spare_probability
    assert two.idle_node_hours_per_day_with < one.idle_node_hours_per_day_with


def test_the_plan_command_prints_the_spares(capsys) -> None:
    assert main(["plan", "--profile", "p5", "--nodes", "16,1024", "--spares", "2", "--node_price", "40"]) == 0
    out = capsys.readouterr().out
    assert "2 hot spares at $40.00 a node-hour: $80.00 per hour" in out
    assert "Llama 3's 419 interruptions in 54 days on 16,384 GPUs, 78% hardware" in out
    assert "spares pay for themselves from" in out
    assert "goodput saved per hour" in out and "net per hour" in out


@pytest.mark.parametrize("argv, message", [
    (["--spares", "-1"], "--spares -1 must be 0 or more"),
    (["--failure_rate", "0"], "--failure_rate 0 must be positive"),
    (["--node_price", "-3"], "--node_price -3 must be positive"),
])  # fmt: skip
def test_the_plan_command_refuses_bad_spares_input(argv, message, capsys) -> None:
    assert main(["plan", "--profile", "p5", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_an_instance_without_a_price_needs_one(tmp_path: Path, capsys) -> None:
    profile = tmp_path / "g6.yaml"
    text = (Path(__file__).resolve().parents[2] / "config/profiles/g5-dev.yaml").read_text()
    profile.write_text(text.replace("g5.8xlarge", "g6.8xlarge"))
    assert main(["plan", "--profile", str(profile)]) == 2
    assert "no price of g6.8xlarge on record" in capsys.readouterr().err
    assert main(["plan", "--profile", str(profile), "--node_price", "2"]) == 0
