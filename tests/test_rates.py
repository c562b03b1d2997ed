"""Rate tables (:mod:`mpisparse.bench.rates`): the committed tables, a user's table, and a file that is not one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mpisparse.bench import advise as adv
from mpisparse.bench import costmodel as cm
from mpisparse.bench import rates as rt

ONE_PROCESS_MPI = True  # no MPI at all (tests/conftest.py lane_of)
ROOT = Path(__file__).resolve().parent.parent


def test_the_committed_h200_table_is_what_its_builder_makes_of_the_committed_measurements():
    from docs_results import rate_table_h200 as build

    committed = json.loads((ROOT / "mpisparse/bench/rate_tables" / rt.BUILTIN["cuda"]).read_text())
    assert committed == json.loads(json.dumps(build.build())), \
        "regenerate with `PYTHONPATH=tools python -m docs_results.rate_table_h200 --write`"
    t = rt.builtin_table("cuda")
    assert t.device == "NVIDIA H200" and set(t.step_fixed) >= {"topk", "cltk", "deft", "gtopk", "powersgd", "oktopk"}
    for src in t.sources:  # every measurement it was built from is committed, with its commit and date
        assert (ROOT / src["file"]).is_file() and src["commit"] and src["date"].endswith("UTC")
    assert all(t.kernel_sources[k] for k in cm.KERNELS) and all(t.step_sources.values())
    # the two kernels never timed alone on a GPU say so
    assert [k for k in cm.KERNELS if "NOT MEASURED" in t.kernel_sources[k]] == ["scatter", "merge"]
    # a GPU's kernel costs a fixed amount a call, and far less per element than this CPU's
    assert t.rates.per_call["topk"] > 1e-5 and t.rates.topk < adv.DEFAULT_RATES.topk / 10


def test_the_cpu_table_is_the_validated_advisors():
    t = rt.builtin_table("cpu")
    assert t.rates == adv.DEFAULT_RATES and t.rates.stream == pytest.approx(0.47e-9) and not t.step_fixed
    assert "docs/results/cost-model.md" in t.kernel_sources["scatter"]
    with pytest.raises(ValueError, match="device 'tpu' has no committed rate table"):
        rt.builtin_table("tpu")


@pytest.mark.parametrize("content, message", [
    ("not json", "not JSON"),
    ('{"kernels": {}}', 'no "format"'),
    ('{"format": "mpisparse-rates/1", "kernels": {"stream": {"seconds_per_element": 1e-9}}}', "topk, fused"),
    ('{"format": "mpisparse-rates/1", "kernels": {"stream": {"seconds_per_element": -1}, "topk": {}, "fused": {}, '
     '"scatter": {}, "segmented": {}, "pick": {}, "merge": {}}}', "stream.seconds_per_element is -1"),
])
def test_a_file_that_is_not_a_rate_table_is_refused_in_one_line(tmp_path, content, message):
    p = tmp_path / "r.json"
    p.write_text(content)
    with pytest.raises(ValueError, match="not a rate table") as e:
        rt.load_table(str(p))
    assert message in str(e.value) and str(p) in str(e.value) and "\n" not in str(e.value)


def test_two_sizes_give_the_rate_and_the_fixed_cost_of_a_call():
    assert rt.fit_two_sizes((1000, 2e-5 + 1000e-9), (10**6, 2e-5 + 1e-3)) == pytest.approx((1e-9, 2e-5))
    assert rt.fit_two_sizes((1000, 1e-7), (10**6, 1e-3)) == pytest.approx((0.9999e-3 / 999000, 0.0))  # none < 0
    with pytest.raises(ValueError, match="larger than the small one"):
        rt.fit_two_sizes((10, 1.0), (10, 2.0))


def test_a_measured_table_round_trips_through_its_file(tmp_path):
    got = rt.time_kernels(np, 4096, 0.01, 0.05, repeats=1)
    assert set(got) == set(cm.KERNELS) and all(u > 0 and t >= 0 for u, t in got.values())
    t = rt.measure_table("cpu", 1 << 15, density=0.01, repeats=1)
    p = tmp_path / "mine.json"
    rt.write_table(str(p), t)
    back = rt.load_table(str(p))
    assert back.rates == t.rates and back.device == t.device and back.path == str(p)
    with pytest.raises(ValueError, match="at least 2,048 elements"):
        rt.measure_table("cpu", 1000)


def test_the_worked_example_quotes_the_generated_predictions():
    import re

    def rows(text: str) -> list[str]:
        return [ln.strip() for ln in text.splitlines() if re.match(r"\| `(resnet50|bert-base|gpt2-small)` \| [\d,]+ \|", ln)]

    choosing = (ROOT / "docs" / "choosing.md").read_text()
    quote = choosing.split("<!-- gpu-cluster-quote:", 1)[1].split("\n\n", 1)[0]
    generated = set(rows((ROOT / "docs" / "results" / "advisor-gpu-cluster.md").read_text()))
    assert rows(quote) and set(rows(quote)) <= generated, "docs/choosing.md's worked example differs from " \
        "docs/results/advisor-gpu-cluster.md: quote the regenerated rows"
