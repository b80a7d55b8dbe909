"""What the Lab's panels show, without a browser: tables with readable headers, units and one spelling for a missing
value; runs named by what sets them apart; the progress line; a figure or table saved from its panel."""

import math

import pandas as pd

from ortlab.engine.progress import Pace, duration
from ortlab.reporting.labels import labels
from ortlab.widgets.export import SaveButton
from ortlab.widgets.layout import MISSING, cell, header, table


def test_a_table_reads_the_same_in_every_panel():
    frame = pd.DataFrame({"median_step_ms": [12.345678, None], "saving_bytes": [1_048_576, 3 * 2**20],
                          "rss_mb": [math.nan, 1.5e6], "verdict": ["agree", None], "in sync": [True, False]})
    html = table(frame)
    assert "None" not in html and "NaN" not in html and "nan" not in html and html.count(MISSING) == 3
    for head in ("median step (ms)", "saving (MB)", "resident set (MB)", "verdict", "in sync"):
        assert f">{head}</th>" in html
    assert ">1</td>" in html and ">3</td>" in html  # bytes in MB, not 1.049e+06
    assert ">1500000</td>" in html and "e+06" not in html and ">12.35</td>" in html and ">yes</td>" in html
    assert "line-height:1.35" in html and "max-width:100%" in html  # rows of text height, within the panel
    assert table(frame.iloc[0:0]) == ""
    assert header("time_change_pct") == "time change (%)" and header("peak resident set (MB)") == \
        "peak resident set (MB)"
    assert cell(float("nan")) == cell(None) == cell("None") == cell(pd.NA) == MISSING and cell(4.2e-07) == "4.20e-07"


class _Run:
    def __init__(self, name, backend, options=None, steps=20, parity=True):
        from pathlib import Path

        self.path, self.backend = Path(f"/runs/{name}"), backend
        self.meta = {"config": {"steps": steps, "parity": parity, "options": options or {}},
                     "model": {"name": "TinyGPT"}, "effective_options": {"enable_compute_optimizer": False}}


def test_runs_are_named_by_what_sets_them_apart():
    runs = [_Run("20261127-010000-ortmodule", "ortmodule"),
            _Run("20261127-010100-ortmodule", "ortmodule", {"memory_opt_level": 1, "save_onnx": True}),
            _Run("20261127-010200-pytorch", "pytorch", steps=50)]
    assert labels(runs) == ["ortmodule · steps 20 · default options",
                            "ortmodule · steps 20 · memory_opt_level=1", "pytorch · steps 50"]
    # what parity mode turns off in every run (enable_compute_optimizer) is no option of one of them
    assert not any("compute_optimizer" in label for label in labels(runs))
    alike = [_Run("20261127-010000-pytorch", "pytorch"), _Run("20261127-010203-pytorch", "pytorch")]
    assert labels(alike) == ["pytorch · 01:00:00", "pytorch · 01:02:03"]


def test_progress_says_the_step_the_time_and_the_time_left():
    pace = Pace(6000, "ortmodule")
    pace.step({"step_time_s": 5.0})  # the first step exports: not what the rest take
    assert pace.line().startswith("ortmodule: step 1/6000 · ") and "left" not in pace.line()
    for _ in range(329):
        pace.step({"step_time_s": 0.01})
    assert pace.line().startswith("ortmodule: step 330/6000 · ") and pace.line().endswith("~57 s left")
    assert duration(12) == "12 s" and duration(150) == "2.5 min" and duration(7200) == "2.0 h"


def test_a_figure_and_a_table_are_saved_into_the_runs_folder(tmp_path):
    png = b"\x89PNG\r\n\x1a\nfake"
    button = SaveButton("loss curve", lambda: png, lambda: tmp_path)
    path = button.save()
    assert path.parent == tmp_path / "exports" and path.suffix == ".png" and path.read_bytes() == png
    assert path.name.endswith("-loss-curve.png") and path.name in button.said.value
    assert button.save() != path  # a second save does not overwrite the first
    frame = pd.DataFrame({"a": [1, 2]})
    saved = SaveButton("burst results", lambda: frame, lambda: tmp_path, kind="CSV").save()
    assert saved.suffix == ".csv" and pd.read_csv(saved)["a"].tolist() == [1, 2]
    empty = SaveButton("nothing", lambda: b"", lambda: tmp_path)
    assert empty.save() is None and "nothing to save yet" in empty.said.value
