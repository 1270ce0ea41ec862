# Run on call 7: the GPU snapshot tests must fail when an ordering is dropped: "none": the fence waits for
# nothing; "direct": for the direct copy alone (no wait for the stage's fill); "reuse": a fill
# of the device stage does not wait for the previous copy out of it.
import sys, pytest, torch
from trainer import snapshot, staging
how = sys.argv[1]
def fence(self):
    for slot in self.slots:
        if slot.pending is not None and slot.guards and how == "direct":
            torch.cuda.current_stream(self.device).wait_event(slot.guards[0])
if how in ("none", "direct"):
    snapshot.Snapshotter.fence = fence
if how == "reuse":
    orig = staging.DeviceStage.capture
    def capture(self, *a, **k):
        self._copied_out = None
        return orig(self, *a, **k)
    staging.DeviceStage.capture = capture
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "tests/trainer/test_snapshot_gpu.py"]))
