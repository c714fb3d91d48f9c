"""scripts/trace_report.py's per-SM budget of the GEMM phases (docs/performance.md, "Where a prefill call goes
at world 1"), on task records written as src/device/diagnostics/trace.cuh stamps them."""

import pytest


def tile(m, cta, phase, expert, mblock, start_us, first_full_us, loop_end_us, end_us):
    """One GEMM task record; stamps in ns as the kernel writes them, the rest not stamped (-1)."""
    r = {s: -1 for s in m.STAMPS}
    r.update(cta=cta, phase=phase, expert=expert, mblock=mblock, nblock=0, rec=0)
    r.update(math_start=int(start_us * 1000), first_full=int(first_full_us * 1000),
             loop_end=int(loop_end_us * 1000), end=int(end_us * 1000))
    return r


def test_budget_sums_per_sm_and_paces_by_m_block(capsys, repo_script):
    m = repo_script("trace_report")
    # FP8 (mma 3): Linear1 K = H = 512 -> 4 k-blocks, Linear2 K = I = 256 -> 2. Expert 0 has m-blocks 0
    # and 1 (its last), expert 1 only m-block 2 (its last). Two CTAs.
    rows = [
        tile(m, 0, 4, 0, 0, 0.0, 1.0, 5.0, 6.0),     # full m-block: k-loop 4 us, 1 us a k-block
        tile(m, 0, 4, 0, 1, 7.0, 7.5, 10.5, 11.0),   # last m-block: k-loop 3 us, 0.75 a k-block
        tile(m, 1, 4, 1, 2, 0.0, 2.0, 4.0, 5.0),     # last m-block: k-loop 2 us, 0.5 a k-block
        tile(m, 1, 5, 1, 2, 6.0, 6.5, 8.5, 10.0),    # Linear2, last m-block: 2 us, 1.0 a k-block
    ]
    b = m.budget(rows, H=512, I=256, mma=3)
    assert b["ctas"] == 2
    assert b["linear1"]["tiles"] == 3 and b["linear1"]["last_mblock_tiles"] == 2
    assert b["linear1"]["k_blocks"] == 4 and b["linear2"]["k_blocks"] == 2
    assert b["linear1"]["kloop"] == pytest.approx((4.0 + 3.0 + 2.0) / 2)
    assert b["linear1"]["epilogue"] == pytest.approx((1.0 + 0.5 + 1.0) / 2)
    assert b["linear1"]["first_stage"] == pytest.approx((1.0 + 0.5 + 2.0) / 2)
    assert b["linear1"]["us_per_kblock_full"] == pytest.approx(1.0)
    assert b["linear1"]["us_per_kblock_last"] == pytest.approx((0.75 + 0.5) / 2)
    assert b["linear2"]["us_per_kblock_last"] == pytest.approx(1.0)
    # Gaps between a CTA's consecutive tiles: CTA 0 6 -> 7, CTA 1 5 -> 6.
    assert b["gaps"] == pytest.approx((1.0 + 1.0) / 2)
    assert b["first_start"] == pytest.approx(0.0) and b["last_end"] == pytest.approx(11.0)
    assert "per-SM budget of the GEMM phases over 2 CTAs" in capsys.readouterr().out


def test_bf16_k_blocks_are_64_wide(repo_script):
    m = repo_script("trace_report")
    b = m.budget([tile(m, 0, 4, 0, 0, 0.0, 1.0, 9.0, 10.0)], H=512, I=256, mma=2)
    assert b["linear1"]["k_blocks"] == 8 and b["linear1"]["us_per_kblock_last"] == pytest.approx(1.0)


def test_no_gemm_tiles_no_budget(repo_script):
    m = repo_script("trace_report")
    assert m.budget([], H=512, I=256, mma=3) == {}


def test_plan_to_roles_per_cta(repo_script):
    m = repo_script("trace_report")
    collect = {s: -1 for s in m.STAMPS}
    collect.update(cta=0, phase=3, expert=0, mblock=0, nblock=0, rec=2, math_start=0, end=9000)
    first = tile(m, 1, 4, 0, 0, 12.0, 15.0, 20.0, 21.0)
    first.update(rec=8, plan_seen=9500, roles_split=11000, taken=11300)
    later = tile(m, 1, 4, 0, 1, 22.0, 23.0, 30.0, 31.0)  # no plan stamps: not a first role record
    steps = m.plan_to_roles([collect, first, later])
    assert steps["plan out->seen"] == pytest.approx([0.5])
    assert steps["seen->roles split"] == pytest.approx([1.5])
    assert steps["split->producer"] == pytest.approx([0.3])
    assert steps["producer->1st stage"] == pytest.approx([3.7])
    assert m.plan_to_roles([first]) == {}  # no collect task recorded


def test_chain_steps_of_the_start_up_tasks(repo_script):
    m = repo_script("trace_report")

    def task(phase, **stamps_us):
        r = {s: -1 for s in m.STAMPS}
        r.update(cta=0, phase=phase, expert=0, mblock=0, nblock=0, rec=0)
        r.update({k: int(v * 1000) for k, v in stamps_us.items()})
        return r

    layout = task(0, math_start=0.0, posted=0.9, loaded=1.4, loop_end=1.8, end=2.8)
    publish = task(1, math_start=0.0, inputs=3.0, epi_stored=3.7, end=4.2)
    collect = task(3, math_start=0.0, inputs=4.6, posted=5.8, loaded=6.2, epi_math=7.3, epi_swiglu=8.1,
                   loop_end=8.3, epi_stored=8.7, end=9.1)
    # A decode kernel's dispatch task: own rows, layout wait, rows sent, entries, arrival adds.
    dispatch = task(2, math_start=0.0, posted=8.5, inputs=9.0, loaded=15.0, epi_stored=15.9, end=18.4)
    steps = m.chain_steps([layout, publish, collect, dispatch])
    assert [label for label, _ in steps["dispatch"]] == ["own rows", "layout wait", "rows sent", "entries", "arrival adds"]
    assert [v for _, (v,) in steps["dispatch"]] == pytest.approx([8.5, 0.5, 6.0, 0.9, 2.5])
    # A prefill kernel's dispatch (no own-rows pass: no posted stamp) is left out.
    assert "dispatch" not in m.chain_steps([task(2, math_start=0.0, inputs=9.0, loaded=15.0, epi_stored=15.9, end=18.4)])
    assert [label for label, _ in steps["layout"]] == ["slots", "tickets", "bases", "rows, done"]
    assert [v for _, (v,) in steps["layout"]] == pytest.approx([0.9, 0.5, 0.4, 1.0])
    assert [v for _, (v,) in steps["publish"]] == pytest.approx([3.0, 0.7, 0.5])
    assert [v for _, (v,) in steps["collect"]] == pytest.approx([4.6, 1.2, 0.4, 1.1, 0.8, 0.2, 0.4, 0.4])
    # A collect record of a build without the schedule's stamps is left out, the others stay.
    old = task(3, math_start=0.0, inputs=4.6, posted=5.8, loaded=6.2, loop_end=8.3, epi_stored=8.7, end=9.1)
    steps = m.chain_steps([layout, old])
    assert "collect" not in steps and "layout" in steps and "publish" not in steps


def test_critical_chain_walks_back_from_the_last_end(capsys, repo_script):
    m = repo_script("trace_report")

    def task(phase, cta, expert=0, mblock=0, nblock=0, **stamps_us):
        r = {s: -1 for s in m.STAMPS}
        r.update(cta=cta, phase=phase, expert=expert, mblock=mblock, nblock=nblock, rec=0, index=0)
        r.update({k: int(v * 1000) for k, v in stamps_us.items()})
        return r

    rows = [
        task(2, 0, math_start=0.0, end=8.4),                 # dispatch
        task(3, 1, math_start=0.0, end=8.8),                 # collect: the plan
        task(4, 2, 3, 3, 5, inputs=12.6, end=31.6),          # Linear1 of expert 3, m-block 3: the later one
        task(4, 3, 3, 3, 4, inputs=12.4, end=30.0),
        task(4, 4, 1, 1, 0, inputs=12.5, end=33.0),          # another expert's, later: not this chain's
        task(5, 5, 3, 3, 7, inputs=35.2, end=42.1),          # the last Linear2 tile
        task(5, 6, 1, 1, 2, inputs=36.0, end=41.0),
        task(6, 7, inputs=12.0, end=46.5),                   # the combine ends the launch
    ]
    chain = m.critical_chain(rows)
    assert [(r["phase"], r["cta"]) for r, _, _ in chain] == [(6, 7), (5, 5), (4, 2), (3, 1)]
    waits = [w for _, _, w in chain]
    assert waits[0] == pytest.approx(46.5 - 42.1)  # the combine's end after the last Linear2 end
    assert waits[1] == pytest.approx(35.2 - 31.6)  # the Linear2 inputs after its Linear1 tiles
    assert waits[2] == pytest.approx(12.6 - 8.8)   # the Linear1 inputs after the plan
    assert waits[3] is None
    m.print_chain(chain)
    out = capsys.readouterr().out
    assert "linear2  e3 m3 n7" in out and "inputs 3.6 after linear1's end" in out
    assert m.critical_chain([]) == []


def test_kernel_edges_around_the_tasks(repo_script, tmp_path):
    m = repo_script("trace_report")
    # Two CTAs: spans 1.0-40.0 and 1.5-38.0 us; task stamps from 3.0 (CTA 0's layout) to 37.0 (its
    # combine). Written as the CSV trace_export.h writes (absolute ns), read back by load().
    head = [0, 2048, 768, 32, 1, 3, 0]  # rank H I E T mma launch

    def row(cta, rec, phase, stamps):
        t = [stamps.get(s, -1) for s in m.STAMPS]
        return ",".join(str(v) for v in head + [cta, 100 + cta, rec, phase, 0, 0, 0, 0] + t)

    base = 5_000_000
    lines = [row(0, -1, -1, {"taken": base + 1000, "end": base + 40000}),
             row(1, -1, -1, {"taken": base + 1500, "end": base + 38000}),
             row(0, 0, 0, {"math_start": base + 3000, "end": base + 5000}),
             row(0, 1, 6, {"math_start": base + 10000, "loop_end": base + 36500, "end": base + 37000})]
    path = tmp_path / "trace.csv"
    path.write_text("\n".join(lines) + "\n")
    spans = {}
    problems = m.load(str(path), spans)
    (key, rows), = problems.items()
    assert len(rows) == 2 and len(spans[key]) == 2  # spans apart from the task records
    e = m.kernel_edges(rows, spans[key])
    assert e["span"] == pytest.approx(39.0)
    assert e["before_first_stamp"] == pytest.approx(2.0)
    assert e["after_last_stamp"] == pytest.approx(3.0)
    assert m.kernel_edges(rows, []) is None
