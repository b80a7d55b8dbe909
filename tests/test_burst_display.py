"""The Burst panel shows the worker's step as it is: when step rows arrive faster than the front end takes widget
updates (a loaded machine: tens of ms each), the display skips to the newest step instead of replaying each one, so
that a Stop clicked at the step shown ends the burst there, not dozens of steps later."""

import time

from ortlab.engine.progress import Pace
from ortlab.engine.session import Session
from ortlab.options import Options
from ortlab.widgets import burst_panel
from ortlab.widgets.burst_panel import BurstPanel


def test_a_backlog_of_steps_is_shown_at_its_newest_not_replayed(tmp_path):
    panel = BurstPanel(Session(out=str(tmp_path / "lab"), in_process=True), Options)
    panel._pace = Pace(200, "pytorch")
    updates = []

    def slow_front_end(change):  # each update of the bar costs what a loaded kernel and browser take
        updates.append(change["new"])
        time.sleep(0.05)

    panel.progress.max = 200
    panel.progress.observe(slow_front_end, "value")
    started = time.monotonic()
    for step in range(100):  # a hundred rows the worker sent while the display was busy
        panel._step("pytorch", {"step": step, "loss": 1.0, "step_time_s": 0.01})
    took = time.monotonic() - started
    assert took < 2.0, f"100 queued steps took {took:.1f} s to show: the display replays them"  # 5 s replayed
    assert len(updates) < 20, updates
    time.sleep(2.5 * burst_panel.SHOW_INTERVAL_S)  # the last step is shown even when no step follows it
    assert panel.progress.value == 100 and updates[-1] == 100
    assert "pytorch: step 100/200" in panel.pace.value
