"""Every plot kind renders (Agg), is not blank, and has honest axes.

Log axes where times and bytes span orders of magnitude; a zero on a log
axis is drawn at the axis bottom as an open triangle labelled ``0`` (never
dropped, never drawn as 1); legends outside the data.
"""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from mpisparse.bench.exchange import plot_exchange  # noqa: E402
from mpisparse.bench.scaling import plot_scaling  # noqa: E402
from mpisparse.bench.select_sweep import plot_deft_select, plot_select_sweep  # noqa: E402
from mpisparse.results import PNG_SIGNATURE, RunResult, plots  # noqa: E402


@pytest.fixture
def figures(monkeypatch):
    """The figures the plot functions save (each is inspected after it is written)."""
    saved = []
    real = plots._save

    def keep(fig, path, dpi=100):
        saved.append(fig)
        real(fig, path, dpi=dpi)

    monkeypatch.setattr(plots, "_save", keep)
    return saved


def assert_not_blank(path):
    import matplotlib.image as mpimg

    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    img = mpimg.imread(str(path))[..., :3]
    assert img.std() > 0.05  # not one flat colour
    assert (img.mean(axis=-1) < 0.9).mean() > 0.01  # some of it is drawn, not just a frame
    assert len(data) < 200_000


def zero_marks(ax) -> int:
    """Zeros drawn at the axis bottom: open triangles with a "0" label."""
    tri = [ln for ln in ax.get_lines() if ln.get_marker() == plots.ZERO_MARKER]
    labels = [t for t in ax.texts if t.get_text() == "0"]
    assert len(tri) == len(labels)
    return len(tri)


def legend_outside(ax) -> bool:
    leg = ax.get_legend()
    if leg is None:
        return False
    return leg.get_window_extent().x0 >= ax.get_window_extent().x1 - 1


def result(scheme, step_ms, sent, world=2, phases=None, **kw):
    phases = phases or {"select": step_ms * 0.4e-3, "exchange_values": step_ms * 0.5e-3}
    return RunResult(scheme=scheme, runtime="collective", world_size=world, density_target=0.001,
                     density_actual=0.001, bytes_sent_per_rank=float(sent), phases=phases,
                     phases_mean_over_ranks=phases, step_seconds=step_ms * 1e-3,
                     step_seconds_mean_over_ranks=step_ms * 1e-3, n=10_000, config={"model": "ncf"}, **kw)


def test_helpers():
    assert plots.spans_decades([0, 1.0, 100.0]) and not plots.spans_decades([0, 1.0, 99.0])
    assert not plots.spans_decades([5.0]) and not plots.spans_decades([0, 0, float("nan")])


def test_phase_bars_log_panels_and_zero_bytes(tmp_path, figures):
    path = tmp_path / "bars.png"
    plots.plot_phase_bars(path, [result("dense", 80.0, 4e6), result("topk", 0.5, 0.0), result("deft", 0.4, 8e3)])
    assert_not_blank(path)
    [fig] = figures
    stack, steps, sent = fig.axes
    assert stack.get_yscale() == "linear"  # a stack must add up: never log
    assert steps.get_yscale() == "log" and sent.get_yscale() == "log"
    assert zero_marks(sent) == 1 and zero_marks(steps) == 0  # topk's 0 bytes, at the bottom
    assert legend_outside(stack)
    # close values, no zero among positives: linear bytes, no extra step panel
    plots.plot_phase_bars(tmp_path / "b2.png", [result("dense", 2.0, 400.0), result("topk", 1.0, 300.0)])
    assert len(figures[1].axes) == 2 and figures[1].axes[1].get_yscale() == "linear"
    # one rank sends nothing: all zeros stay on a linear axis (a log axis would have nothing to show)
    plots.plot_phase_bars(tmp_path / "b3.png", [result("dense", 2.0, 0.0, world=1)])
    assert figures[2].axes[-1].get_yscale() == "linear"
    assert_not_blank(tmp_path / "b3.png")


def test_history_log_loss_and_linear_accuracy(tmp_path, figures):
    hist = [{"epoch": e, "iteration": 50 * e, "wall_seconds": 1.0 * e, "train_loss": 10.0 ** -e,
             "test_loss": 10.0 ** -e, "test_accuracy": 0.5 + 0.1 * e} for e in (1, 2, 3)]
    res = result("dense", 2.0, 100.0, metrics={"final": hist[-1], "per_epoch": hist})
    res.config.update(model="mlp", data="digits")
    steps = {"dense": [{"iteration": i, "wall_seconds": 0.02 * i, "loss": 2.0 * 0.9 ** i} for i in range(1, 150)]}
    plots.plot_history([res], steps, tmp_path / "h.png")
    assert_not_blank(tmp_path / "h.png")
    [fig] = figures
    loss_it, loss_t, acc_it, acc_t = fig.axes
    assert loss_it.get_yscale() == loss_t.get_yscale() == "log"  # 2 .. 1e-7: many decades
    assert acc_it.get_yscale() == acc_t.get_yscale() == "linear"
    assert legend_outside(loss_t)


def test_scaling_panels_draw_a_zero_at_the_bottom(tmp_path, figures):
    rows = []
    for w, step, sent in ((1, 1.0, 0.0), (2, 3.0, 5e3), (4, 5.0, 2e4)):
        for scheme, f in (("dense", 10.0), ("topk", 1.0)):
            r = result(scheme, step * f, sent * f, world=w).to_dict()
            r.update(baseline="dense", speedup_over_baseline=f)
            rows.append(r)
    plot_scaling(tmp_path / "s.png", rows)
    assert_not_blank(tmp_path / "s.png")
    [fig] = figures
    t, speed, b = fig.axes
    assert t.get_yscale() == "log" and b.get_yscale() == "log" and speed.get_yscale() == "linear"
    assert t.get_xscale() == "log"
    assert zero_marks(b) == 2  # W=1: dense and topk send nothing
    ys = [y for ln in b.get_lines() if ln.get_marker() != plots.ZERO_MARKER for y in ln.get_ydata()]
    assert 1.0 not in ys and min(y for y in ys if y > 0) == 5e3  # no zero was turned into 1
    assert b.get_ylim()[0] > 1e3  # nor clipped to a tiny value that stretches the axis down
    assert all(legend_outside(ax) for ax in fig.axes)


def test_exchange_panels(tmp_path, figures):
    rows = []
    for d in (0.001, 0.01, 0.1):
        for s, f in (("dense", 1.0), ("topk", d)):
            r = result(s, 5.0 * f, 4e6 * f).to_dict()
            r.update(density_target=d, exchange_seconds=4e-3 * f)
            rows.append(r)
    plot_exchange(tmp_path / "e.png", rows)
    assert_not_blank(tmp_path / "e.png")
    assert [ax.get_yscale() for ax in figures[0].axes] == ["log", "log"]
    assert figures[0].axes[0].get_xscale() == "log"


def test_select_sweep_and_deft_panels(tmp_path, figures):
    sweep = [{"backend": "numpy", "params": {"n": n, "density": d, "k": int(n * d), "repeats": 1},
              "timings": {"topk_abs": {"best_ms": n * 1e-5, "median_ms": n * 1e-5},
                          "threshold_select": {"best_ms": n * 3e-6, "median_ms": n * 3e-6}}, "ratios": {}}
             for n in (10_000, 1_000_000) for d in (0.001, 0.01)]
    plot_select_sweep(tmp_path / "k.png", sweep)
    assert_not_blank(tmp_path / "k.png")
    assert all(ax.get_yscale() == "log" and ax.get_xscale() == "log" for ax in figures[0].axes)
    deft = [{"model": "resnet50", "world_size": w, "density": 0.01, "speedup_measured": 0.9 * w,
             "deft_max_seconds": 0.1 / w, "topk_seconds": 0.1} for w in (1, 2, 4, 8)]
    plot_deft_select(tmp_path / "d.png", deft)
    assert_not_blank(tmp_path / "d.png")
    assert [ax.get_yscale() for ax in figures[1].axes] == ["log", "log"]
