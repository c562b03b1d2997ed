"""Progress lines: throttled to one per interval off a terminal, with rate and ETA."""

import io

from mpisparse.results.progress import Progress, format_eta


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_off_a_terminal_one_line_per_interval_with_rate_and_eta():
    clock, out = Clock(), io.StringIO()
    p = Progress("bench step topk", 100, interval=10, stream=out, clock=clock, tty=False)
    for i in range(1, 101):
        clock.t += 0.5  # 2 steps per second: a line every 20 steps
        p.update(i, loss=1.0 / i)
    p.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 5, lines  # at 10, 20, 30, 40, 50 s (the last one is the end)
    assert lines[0].startswith("[bench step topk] step 20/100 20% | 2.0 steps/s | ETA 0:00:40 | loss 0.05")
    assert lines[-1].startswith("[bench step topk] step 100/100 100% | 2.0 steps/s | ETA 0:00:00")


def test_a_short_run_prints_nothing_and_disabled_prints_nothing():
    clock, out = Clock(), io.StringIO()
    p = Progress("x", 10, interval=10, stream=out, clock=clock, tty=False)
    for i in range(1, 11):
        clock.t += 0.1
        p.update(i)
    p.close()
    assert out.getvalue() == ""
    p = Progress("x", 10, interval=0, stream=out, clock=clock, tty=False, enabled=False)
    p.update(5)
    p.close()
    assert out.getvalue() == ""


def test_what_and_fields_are_shown():
    clock, out = Clock(), io.StringIO()
    p = Progress("train topk", 560, interval=1, stream=out, clock=clock, tty=False)
    clock.t += 2
    p.update(120, "epoch 3/20", loss=0.12345, acc="97%")
    assert out.getvalue().strip() == ("[train topk] epoch 3/20 step 120/560 21% | 60.0 steps/s | ETA 0:00:07 | "
                                      "loss 0.1235 | acc 97%")


def test_format_eta():
    assert format_eta(3725.4) == "1:02:05" and format_eta(None) == "?" and format_eta(float("nan")) == "?"
