"""Learning curves: mean episode return and env steps/s against env steps, one line per run, from
rows in progress.csv's layout (``asyncrl plot``, ``APPO.plot``)."""
from __future__ import annotations

import io
from typing import Dict, List

from .config import ConfigError

RETURN, FPS, STEPS = "rollout/ep_rew_mean", "time/fps", "time/total_timesteps"


def curves_figure(runs: Dict[str, List[dict]]):
    """A matplotlib Figure of ``{label: rows}`` (values numbers or strings, as a CSV gives them;
    a row without a value for a curve is skipped)."""
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ConfigError("plotting needs matplotlib: pip install 'asyncrl[bench]'") from e
    fig = Figure(figsize=(7, 6))
    ax_ret, ax_fps = fig.subplots(2, 1, sharex=True)
    for label, rows in runs.items():
        for ax, key in ((ax_ret, RETURN), (ax_fps, FPS)):
            pts = [(float(r[STEPS]), float(r[key])) for r in rows if r.get(key) not in (None, "")]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label)
    ax_ret.set_ylabel("mean episode return")
    ax_fps.set_ylabel("env steps / s")
    ax_fps.set_xlabel("env steps")
    ax_ret.legend(fontsize="small")
    fig.tight_layout()
    # Shown as an image when it is a notebook cell's value (no pyplot figure: nothing else is
    # drawn at the cell's end, and scripts need no display backend).
    fig._repr_png_ = lambda: _png(fig)
    return fig


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
