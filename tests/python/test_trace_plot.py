"""scripts/trace_plot.py draws a Chrome trace-event timeline (`epfuse bench --trace`) as a PNG."""
import json

import pytest


def timeline(tmp_path):
    # Two CTAs of rank 0 as tools/bench/trace_export.cpp names them, one task with a wait and a k-loop.
    ev = [
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "CTA 0"}},
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": 5, "args": {"name": "CTA 1 math"}},
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": -1, "args": {"name": "launches"}},
        {"name": "kernel (launch 0)", "ph": "X", "pid": 0, "tid": 0, "ts": 0.0, "dur": 20.0, "args": {}},
        {"name": "dispatch", "ph": "X", "pid": 0, "tid": 0, "ts": 1.0, "dur": 6.0, "args": {}},
        {"name": "wait: layout done", "ph": "X", "pid": 0, "tid": 0, "ts": 1.0, "dur": 3.0, "args": {}},
        {"name": "linear1", "ph": "X", "pid": 0, "tid": 5, "ts": 8.0, "dur": 10.0, "args": {}},
        {"name": "k-loop", "ph": "X", "pid": 0, "tid": 5, "ts": 9.0, "dur": 6.0, "args": {}},
        {"name": "launch 0", "ph": "X", "pid": 0, "tid": -1, "ts": 0.0, "dur": 20.0, "args": {}},
        {"name": "linear1", "ph": "X", "pid": 1, "tid": 5, "ts": 8.0, "dur": 10.0, "args": {}},
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    return path


def test_draws_one_ranks_bars(tmp_path, repo_script):
    pytest.importorskip("matplotlib")
    out = tmp_path / "trace.png"
    n = repo_script("trace_plot").plot(str(timeline(tmp_path)), str(out), rank=0)
    assert n == 6  # rank 0's complete events; rank 1's is not drawn
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_rank_without_events_is_an_error(tmp_path, repo_script):
    pytest.importorskip("matplotlib")
    with pytest.raises(SystemExit, match="no events of rank 3"):
        repo_script("trace_plot").plot(str(timeline(tmp_path)), str(tmp_path / "x.png"), rank=3)


def test_bars_are_rectangles_tasks_under_their_steps(tmp_path, repo_script):
    mod = repo_script("trace_plot")
    _, bars = mod.load(str(timeline(tmp_path)), 0)
    verts, faces, seen = mod.rectangles(bars, {-1: 0, 0: 1, 5: 2})
    # Longest first (equal lengths in trace order), so a task's steps are drawn over it.
    assert [(v[0][0], v[2][0]) for v in verts] == [(0.0, 20.0), (0.0, 20.0), (8.0, 18.0), (1.0, 7.0), (9.0, 15.0),
                                                  (1.0, 4.0)]
    assert faces == ["#f0f0f0", "#f0f0f0", mod.COLOURS["linear1"], mod.COLOURS["dispatch"], mod.COLOURS["k-loop"],
                     mod.WAIT]
    # Tasks 0.85 of a row high, their steps and the kernel and launch windows 0.45, centred on their row.
    assert [y for v in verts for y in (v[0][1], v[1][1])] == pytest.approx(
        [0.775, 1.225, -0.225, 0.225, 1.575, 2.425, 0.575, 1.425, 1.775, 2.225, 0.775, 1.225])
    assert list(seen) == ["linear1", "dispatch", "k-loop", "wait"]  # the legend: no kernel or launch windows


def test_only_bars_on_a_row_are_rectangles(tmp_path, repo_script):
    mod = repo_script("trace_plot")
    _, bars = mod.load(str(timeline(tmp_path)), 0)
    verts, _, _ = mod.rectangles(bars, {0: 0})  # CTA 0 only: its kernel window, dispatch and wait
    assert [(v[0][0], v[2][0]) for v in verts] == [(0.0, 20.0), (1.0, 7.0), (1.0, 4.0)]
