"""The typed result (RunResult) and its views: JSON round trip, schema version, table, CSV, plots."""

import csv
import json
import os

import numpy as np
import pytest

from mpisparse.results import (PNG_SIGNATURE, SCHEMA_VERSION, RunResult, format_comparison, format_run,
                               format_train_comparison, plot_history, result_row, write_json, write_results)


def bench_result(scheme="topk", step=0.004, runtime="collective", **kw):
    return RunResult(
        scheme=scheme, runtime=runtime, world_size=2, density_target=0.01, density_actual=0.0123,
        bytes_sent_per_rank=1234.0, phases={"select": 0.001, "exchange_values": 0.002},
        phases_mean_over_ranks={"select": 0.0008, "exchange_values": 0.0015}, step_seconds=step,
        step_seconds_mean_over_ranks=step * 0.9, n=1000, config={"model": "ncf", "scheme": scheme},
        k=10, layers=3, gradient_buffer_bytes=4000, peak_rss_bytes_per_rank=50 * 2**20, **kw)


def train_result(scheme="dense", runtime="collective", **kw):
    history = [{"epoch": e, "iteration": 10 * e, "wall_seconds": 0.5 * e, "train_loss": 1.0 / e,
                "test_loss": 0.9 / e, "test_accuracy": 0.5 + 0.1 * e} for e in (1, 2, 3)]
    return RunResult(
        scheme=scheme, runtime=runtime, world_size=2, density_target=0.01, density_actual=0.02,
        bytes_sent_per_rank=99.0, phases={"forward": 0.001, "backward": 0.002, "update": 0.0005},
        phases_mean_over_ranks={"forward": 0.001, "backward": 0.002, "update": 0.0004}, step_seconds=0.005,
        step_seconds_mean_over_ranks=0.004, n=500, config={"model": "mlp", "data": "digits"},
        skipped_steps=0, metrics={"final": dict(history[-1]), "per_epoch": history}, **kw)


def test_round_trip_through_dict_and_json_keeps_every_field(tmp_path):
    res = bench_result(exchange={"exchange_seconds": 0.002, "exchange_phases": {"exchange_values": 0.002}},
                       extra={"baseline": "dense"})
    d = res.to_dict()
    assert d["schema_version"] == SCHEMA_VERSION == 2 and d["runtime"] == "collective"
    assert d["exchange_seconds"] == 0.002 and d["baseline"] == "dense"  # blocks are top-level keys
    assert "metrics" not in d and "mp" not in d  # unknown optional fields are left out
    path = tmp_path / "r.json"
    write_json(path, res)
    back = RunResult.from_dict(json.loads(path.read_text()))
    assert back == res


def test_ps_and_mp_blocks_round_trip_and_runtime_is_inferred_for_older_files():
    ps = RunResult.from_dict({**bench_result().to_dict(), "runtime": "ps", "servers": 1, "workers": 2,
                              "ps_mode": "sync"})
    assert ps.ps == {"servers": 1, "workers": 2, "ps_mode": "sync"} and ps.extra == {}
    old = {k: v for k, v in ps.to_dict().items() if k not in ("schema_version", "runtime")}
    assert RunResult.from_dict(old).runtime == "ps"
    mp = train_result(runtime="mp", mp={"stages": 2})
    assert mp.to_dict()["mp"] == {"stages": 2} and RunResult.from_dict(mp.to_dict()) == mp
    with pytest.raises(ValueError, match="schema_version 3"):
        RunResult.from_dict({**mp.to_dict(), "schema_version": 3})
    v1 = {k: v for k, v in mp.to_dict().items() if k != "provenance"} | {"schema_version": 1}
    assert RunResult.from_dict(v1).provenance is None  # a file written before provenance existed
    with pytest.raises(ValueError, match="runtime 'x'"):
        train_result(runtime="x")


def test_printed_tables_render_from_a_result():
    text = format_run(bench_result(), "bench step")
    assert "topk on ncf (1,000 elements, 3 layers), W=2, density 0.01" in text
    assert "exchange_values" in text and "peak RSS/rank" in text and "(13107.2x buffer)" in text
    lines = format_comparison([bench_result("dense", 0.008), bench_result("topk", 0.004)]).splitlines()
    assert lines[0].split()[:3] == ["scheme", "step", "ms"] and set(lines[1]) == {"-", " "}
    assert lines[3].split()[:3] == ["topk", "4.00", "2.00x"]
    text = format_run(train_result(), "train")
    assert "dense: per-phase time per step (ms), 500 parameters" in text and "test accuracy     80.00%" in text
    assert "compensate" in text and "send_activations" not in text  # optional phases only when measured
    assert "80.00%" in format_train_comparison([train_result()])


def test_csv_and_json_files_from_results(tmp_path):
    results = [bench_result("dense", 0.008), bench_result("topk", 0.004)]
    write_results(results, command="bench step", json_path=tmp_path / "r.json", csv_path=tmp_path / "r.csv")
    assert [r["scheme"] for r in json.loads((tmp_path / "r.json").read_text())] == ["dense", "topk"]
    rows = list(csv.DictReader(open(tmp_path / "r.csv")))
    assert rows[1]["scheme"] == "topk" and float(rows[1]["phase_select_ms"]) == pytest.approx(1.0)
    assert result_row(results[0]) == result_row(results[0].to_dict())


def _assert_png_not_blank(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    import matplotlib.image as mpimg

    img = mpimg.imread(str(path))
    assert img.std() > 0.01  # not one flat colour


def test_plots_render_from_results(tmp_path):
    pytest.importorskip("matplotlib")
    said = []
    write_results([bench_result("dense", 0.008), bench_result("topk", 0.004)], command="bench step",
                  plot_path=tmp_path / "bars.png", echo=said.append)
    _assert_png_not_blank(tmp_path / "bars.png")
    assert said == [f"plot written to {tmp_path / 'bars.png'}"]
    steps = {"dense": [{"iteration": i, "wall_seconds": 0.1 * i, "loss": 2.0 / i} for i in range(1, 30)]}
    plot_history([train_result()], steps, tmp_path / "history.png")
    _assert_png_not_blank(tmp_path / "history.png")


def test_tables_are_plain_ascii_off_a_terminal_and_rich_on_one(monkeypatch):
    from mpisparse.results import tables

    text = format_run(train_result(), "train") + format_comparison([bench_result("dense", 0.008), bench_result()])
    assert text.isascii() and "\x1b[" not in text  # pytest's stdout is not a terminal
    assert all(line == line.rstrip() for line in text.splitlines())
    monkeypatch.setattr(tables, "_terminal", lambda: True)
    fancy = format_comparison([bench_result("dense", 0.008), bench_result()])
    assert "\x1b[1m" in fancy and "\u2500" in fancy  # a bold header over a box-drawn line
    assert "topk" in fancy and "2.00x" in fancy


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc/self/clear_refs")
def test_peak_rss_resets_between_schemes():
    """bench step resets the peak before each scheme, so one scheme's peak is not the job's."""
    from mpisparse.results.build import current_rss_bytes, peak_rss_bytes, reset_peak_rss

    big = np.ones(64 * 2**20, dtype=np.uint8)  # 64 MiB resident
    high = peak_rss_bytes()
    del big
    assert reset_peak_rss() is True
    after = peak_rss_bytes()
    assert after < high - 32 * 2**20, (after, high)
    assert after >= current_rss_bytes() - 4 * 2**20
