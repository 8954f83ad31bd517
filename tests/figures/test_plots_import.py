"""Matplotlib is imported by the first figure drawn, not by the modules that can draw: a command that draws
nothing (translate, serve, train without --plots) starts without it."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import multibranch.loading.model, multibranch.tasks, multibranch.train.trainer, multibranch.serve.server
import multibranch.analysis.lengths, multibranch.pruning.head_report
print('matplotlib' in sys.modules)
from multibranch.figures import plots
fig = plots.pruning_curve_plot([{"fraction": 0.0, "score": 30.0}, {"fraction": 0.5, "score": 20.0}])
import matplotlib
print('matplotlib.pyplot' in sys.modules, matplotlib.get_backend().lower())
"""


def test_modules_that_can_draw_import_matplotlib_only_when_they_draw():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True", "agg"]
