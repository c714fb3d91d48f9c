"""scripts/ab_summary.py: an A/B's bench JSON files (one a binary and round) summarised a shape and a binary."""

import json

import pytest


def bench_file(dirpath, name, rows, ranks=2):
    """A `epfuse bench --json` file with the given (config, T, median us, verified[, sustained us a call])
    rows, at world `ranks`."""
    def row(c, t, us, ok, sustained_us=None):
        r = {"config": c, "tokens_per_rank": t, "ranks": ranks, "dtype": "fp8", "impl": "fused",
             "median_ms": us / 1e3, "verified": ok}
        if sustained_us is not None:
            r["sustained"] = {"calls": 500, "ms_per_call": sustained_us / 1e3}
        return r

    data = {"rows": [row(*r) for r in rows]}
    path = dirpath / name
    path.write_text(json.dumps(data))
    return str(path)


def test_rounds_median_range_and_ratio_to_main(tmp_path, repo_script):
    m = repo_script("ab_summary")
    files = [
        bench_file(tmp_path, "main-r1.json", [("dsv3", 1, 100.0, True), ("dsv3", 4096, 4000.0, True)]),
        bench_file(tmp_path, "main-r2.json", [("dsv3", 1, 102.0, True), ("dsv3", 4096, 4010.0, True)]),
        bench_file(tmp_path, "main-r3.json", [("dsv3", 1, 110.0, True), ("dsv3", 4096, 4020.0, True)]),
        bench_file(tmp_path, "new-r1.json", [("dsv3", 1, 95.0, True), ("dsv3", 4096, 4040.0, False)]),
        bench_file(tmp_path, "new-r2.json", [("dsv3", 1, 97.0, True), ("dsv3", 4096, 4050.0, True)]),
        bench_file(tmp_path, "new-r3.json", [("dsv3", 1, 99.0, True), ("dsv3", 4096, 4060.0, True)]),
    ]
    table, tags = m.collect(files)
    assert tags == {"main", "new"}
    lines = m.summarise(table, tags, "main")
    assert lines[0] == "config T/rank ranks dtype | main | new (x main)"
    # T=1: medians of the rounds 102 and 97, ranges over the rounds, 97 / 102.
    assert lines[1] == f"dsv3 1 2 fp8 | 102.0 [100.0-110.0] | 97.0 [95.0-99.0] {97 / 102:.3f}"
    # T=4096: one round of the new binary did not verify, so the row says so.
    assert lines[2].endswith("UNVERIFIED") and lines[2].startswith("dsv3 4096 2 fp8 | 4010.0 [4000.0-4020.0]")


def test_names_tags_and_base(tmp_path, repo_script, capsys):
    m = repo_script("ab_summary")
    assert m.tag_and_round("/x/ab-lob-qwen3-r2.json") == ("lob", 2)
    assert m.tag_and_round("early-r10.json") == ("early", 10)
    with pytest.raises(ValueError):
        m.tag_and_round("results.json")
    files = [bench_file(tmp_path, "b-r1.json", [("qwen3-30b", 8, 80.0, True)]),
             bench_file(tmp_path, "a-r1.json", [("qwen3-30b", 8, 90.0, True)])]
    assert m.main(files) == 0  # no "main": the first tag in sorted order is the base
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "config T/rank ranks dtype | a | b (x a)"
    assert out[1] == f"qwen3-30b 8 2 fp8 | 90.0 [90.0-90.0] | 80.0 [80.0-80.0] {80 / 90:.3f}"
    assert m.main(["--base", "c"] + files) == 2


def test_sustained_rows_get_their_own_table(tmp_path, repo_script, capsys):
    m = repo_script("ab_summary")

    files = [bench_file(tmp_path, f"{tag}-r{i + 1}.json", [("mixtral", 4096, us, True, sustained_us)], ranks=1)
             for tag, rounds in (("main", [(2830.0, 2996.0), (2850.0, 3000.0)]), ("new", [(2730.0, 3002.0), (2710.0, 2998.0)]))
             for i, (us, sustained_us) in enumerate(rounds)]
    table, tags = m.collect(files)
    # The medians say 4.5% faster; the sustained calls at the cap say even.
    assert m.summarise(table, tags, "main")[1] == f"mixtral 4096 1 fp8 | 2840.0 [2830.0-2850.0] | 2720.0 [2710.0-2730.0] {2720 / 2840:.3f}"
    sustained = m.summarise(table, tags, "main", "sustained")
    assert sustained[0] == "sustained: config T/rank ranks dtype | main | new (x main)"
    assert sustained[1] == f"mixtral 4096 1 fp8 | 2998.0 [2996.0-3000.0] | 3000.0 [2998.0-3002.0] {3000 / 2998:.3f}"
    assert m.main(files) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4 and out[2].startswith("sustained: ")
    # Without sustained runs there is one table.
    plain = [bench_file(tmp_path, "main-r3.json", [("dsv3", 1, 100.0, True)])]
    assert m.main(plain) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
