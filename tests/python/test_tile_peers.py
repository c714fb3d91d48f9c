"""scripts/tile_peers.py: the tile benchmark's shapes for DeepGEMM, and the two logs as one table."""

TILE_LOG = """seed 1 (rerun: bench_fp8_tile_shapes 1)
ok   check check-a (600 rows, N 768, K 768): rel frob 0.00167 (bound 4e-3), worst row 141 0.00192 (bound 8e-3), non-finite 0
ok   bench qwen3-30b T=16384 Linear2 (32 x 4096 rows, N 2048, K 768): 0.4565 ms (median of 21; p10 0.4530, p90 0.4585), 903 TFLOP/s
ok   bench qwen3-30b T=16384 Linear2, k-loop only (32 x 4096 rows, N 2048, K 768): 0.3721 ms (median of 21; p10 0.3705, p90 0.3760), 1108 TFLOP/s
ok   bench dsv3 T=4096 Linear1 (64 x 512 rows, N 4096, K 7168): 1.8998 ms (median of 21; p10 1.8940, p90 1.9144), 1013 TFLOP/s
PASSED
"""
DG_LOG = """deepgemm-fp8 tile shape: 32 experts x 4096 rows, N=2048 K=768: 0.427 ms (median of 21), 967 TFLOP/s, rel err 3.7e-02
"""


def test_shapes_skip_the_kloop_only_lines(tmp_path, repo_script, capsys):
    m = repo_script("tile_peers")
    log = tmp_path / "tile.log"
    log.write_text(TILE_LOG)
    assert m.main(["shapes", str(log)]) == 0
    assert capsys.readouterr().out.splitlines() == ["qwen3-30b T=16384 Linear2|32|4096|2048|768",
                                                    "dsv3 T=4096 Linear1|64|512|4096|7168"]


def test_table_ratios_and_missing_peer(tmp_path, repo_script, capsys):
    m = repo_script("tile_peers")
    tile, dg = tmp_path / "tile.log", tmp_path / "dg.log"
    tile.write_text(TILE_LOG)
    dg.write_text(DG_LOG)
    assert m.main(["table", str(tile), str(dg)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == f"qwen3-30b T=16384 Linear2 (32 x 4096, N 2048, K 768) | 0.4565 | 0.4270 | {0.4565 / 0.427:.3f}"
    assert out[2] == "dsv3 T=4096 Linear1 (64 x 512, N 4096, K 7168) | 1.8998 | - | DeepGEMM did not run"
    empty = tmp_path / "empty.log"
    empty.write_text("FAILED\n")
    assert m.main(["table", str(empty), str(dg)]) == 1
    assert m.main([]) == 2
