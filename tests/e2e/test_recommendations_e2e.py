"""End to end (real ``tensorboard --logdir``, real headless Chromium) for the severities and
advice that fit (helper sev3b):

- HTA's MI250 trace: the tab shows the warm-up advice ("profile after warm-up", the profiler
  schedule) and no launch-overhead advice; the GPU utilization and short-kernel cards are
  uncoloured with "not judged" words (data-severity "none", no green), the occupancy card
  names ROCm;
- demo_logs' V100 ResNet-50 num_workers=0 (input-bound): the GPU utilization card (55.5 %)
  is uncoloured "not judged", while a judged "ok" card on the same page is green.
Colours are read from the page's computed styles, not from class names alone.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import TRACES

MI250 = TRACES / "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"
V100_NW0 = Path(__file__).resolve().parents[2] / "demo_logs" / "resnet50_v100_nw0"


@pytest.fixture(scope="module")
def base(tmp_path_factory, tensorboard_server):
    if not MI250.exists() or not V100_NW0.is_dir():
        pytest.skip("../shared/traces or demo_logs not present")
    logdir = tmp_path_factory.mktemp("sev") / "logs"
    (logdir / "mi250_rocm").mkdir(parents=True)
    os.symlink(MI250, logdir / "mi250_rocm" / MI250.name)
    (logdir / "v100_nw0").mkdir()
    for f in V100_NW0.iterdir():
        os.symlink(f, logdir / "v100_nw0" / f.name)
    return tensorboard_server(logdir)




CARD_STYLE = """(id) => { const c = document.querySelector(`.card[data-card="${id}"]`);
  const v = c.querySelector('.card-value'), w = c.querySelector('.card-verdict');
  return {severity: c.dataset.severity, value: getComputedStyle(v).color,
          verdict: w ? w.textContent : '', border: getComputedStyle(c).borderTopColor}; }"""
GREEN = "() => getComputedStyle(document.documentElement).getPropertyValue('--green').trim()"


def _rgb(iframe, css_color):
    return iframe.evaluate("(c) => { const e = document.createElement('span'); e.style.color = c;"
                           " document.body.appendChild(e); const r = getComputedStyle(e).color; e.remove();"
                           " return r; }", css_color)


def test_mi250_warmup_advice_and_not_judged_cards(base, browser_page):
    w = browser_page(base)
    frame, iframe = w.open_run("mi250_rocm", ready='.card[data-card="gpu_utilization"]')
    green = _rgb(iframe, iframe.evaluate(GREEN))
    for card in ("gpu_utilization", "short_kernels"):
        st = iframe.evaluate(CARD_STYLE, card)
        assert st["severity"] == "none", (card, st)
        assert "not judged" in st["verdict"] and "warm-up" in st["verdict"], (card, st)
        assert st["value"] != green and st["border"] != green, (card, st, green)
    occ = iframe.evaluate(CARD_STYLE, "occupancy")
    assert "ROCm kernels carry no" in occ["verdict"] and "old trace or ROCm" not in occ["verdict"], occ
    recs = frame.locator(".recs").inner_text()
    assert "first-call warm-up" in recs and "schedule(wait=1, warmup=1, active=3)" in recs, recs
    assert "launch-bound" not in recs and "torch.compile" not in recs, recs
    w.check_clean()


def test_input_bound_gpu_utilization_is_uncoloured_beside_a_green_card(base, browser_page):
    w = browser_page(base)
    frame, iframe = w.open_run("v100_nw0", ready='.card[data-card="gpu_utilization"]')
    green = _rgb(iframe, iframe.evaluate(GREEN))
    st = iframe.evaluate(CARD_STYLE, "gpu_utilization")
    assert st["severity"] == "none" and "not judged" in st["verdict"] and "input" in st["verdict"], st
    assert st["value"] != green and st["border"] != green, (st, green)
    ok = iframe.evaluate(CARD_STYLE, "sync")  # judged and fine on this trace: green
    assert ok["severity"] == "ok" and ok["value"] == green, (ok, green)
    w.check_clean()
