# epfuse_add_run_matrix(<impl>): the GPU correctness matrix of `epfuse run --impl <impl>`, as ctest
# entries run_<impl>_<case>. Each compares every rank's output with the float64 CPU reference and
# fails on any unwritten element; it is skipped (exit 77) where the machine has fewer GPUs than it
# needs (EPFUSE_SKIP_IF_FEWER_GPUS=1), so CI without GPUs shows it as skipped.
# Include this file and call the function from any tests folder (the fused kernel's tests do).

function(epfuse_add_run_test impl name timeout)
  set(test run_${impl}_${name})
  add_test(NAME ${test} COMMAND $<TARGET_FILE:epfuse_cli> run --impl ${impl} ${ARGN})
  # RUN_SERIAL: two tests' ranks would share GPUs. NCCL_NVLS_ENABLE=0: never NVLink multicast.
  set_tests_properties(${test} PROPERTIES
    SKIP_RETURN_CODE 77 RUN_SERIAL TRUE TIMEOUT ${timeout} LABELS "gpu;run"
    ENVIRONMENT "EPFUSE_SKIP_IF_FEWER_GPUS=1;NCCL_NVLS_ENABLE=0")
endfunction()

function(epfuse_add_run_matrix impl)
  # A small shape that still has several experts per rank at world 4 and a k that spreads a token
  # over several ranks.
  set(small --hidden 256 --intermediate 256 --experts 16 --topk 4)
  foreach(world 1 2 4)
    foreach(routing uniform skewed one-expert dropped)
      foreach(tokens 0 1 7 128)
        epfuse_add_run_test(${impl} w${world}_${routing}_t${tokens} 120
          ${small} --ranks ${world} --routing ${routing} --tokens ${tokens} --seed ${world}${tokens})
      endforeach()
    endforeach()
  endforeach()
  # Uneven token counts, a rank with none among them.
  foreach(routing uniform skewed one-expert dropped)
    epfuse_add_run_test(${impl} w2_${routing}_uneven 120 ${small} --ranks 2 --routing ${routing} --tokens 128,0)
    epfuse_add_run_test(${impl} w4_${routing}_uneven 120 ${small} --ranks 4 --routing ${routing} --tokens 128,0,7,1)
  endforeach()
  # The clamped SwiGLU (LayerConfig::swiglu_clamp), at a clamp the generated activations exceed.
  epfuse_add_run_test(${impl} w2_clamp 120 ${small} --clamp 0.25 --ranks 2 --tokens 64,33)
  # The named model shapes (config.h) at modest T, sampled rows (the reference regenerates the experts).
  foreach(model dsv3 qwen3-30b mixtral)
    foreach(world 2 4)
      epfuse_add_run_test(${impl} w${world}_${model} 600
        --model ${model} --ranks ${world} --tokens 128 --verify-rows 8)
    endforeach()
  endforeach()
  # Rows of several dispatch chunks (task_map.h dispatch_row_chunks: tasks of fewer than 8 tokens cut
  # each row into 2048-column pieces), the last one 64 columns: H = 4160, zero-padded to the tiles.
  set(wide --hidden 4160 --intermediate 256 --experts 16 --topk 4)
  epfuse_add_run_test(${impl} w1_wide_t7 120 ${wide} --ranks 1 --tokens 7)
  epfuse_add_run_test(${impl} w2_wide_uneven 120 ${wide} --ranks 2 --tokens 7,1)
  # Many consecutive calls with fresh routing and token counts each call: no reset between calls.
  foreach(world 1 2 4)
    epfuse_add_run_test(${impl} w${world}_vary200 300
      ${small} --ranks ${world} --tokens 128 --iters 200 --vary --verify-every 10 --verify-rows 16)
  endforeach()
endfunction()

# epfuse_add_one_gpu_run_matrix(<impl>): the same matrix with every rank in one process on one GPU
# (`epfuse run --one-gpu`, the loopback transport), as ctest entries run_<impl>_onegpu_<case>, at
# worlds 2, 4 and 8; plus world 8 at top-8 with E = 64 (E/R = 8: one-rank routing sends a token to
# every local expert of one rank) and E = 256, and world 16. Needs one GPU; skipped without.
function(epfuse_add_one_gpu_run_matrix impl)
  set(small --hidden 256 --intermediate 256 --experts 16 --topk 4)
  set(uneven_2 128,0)
  set(uneven_4 128,0,7,1)
  set(uneven_8 128,0,7,1,96,33,0,5)
  foreach(world 2 4 8)
    foreach(routing uniform skewed one-expert dropped one-rank)
      foreach(tokens 0 1 7 128)
        epfuse_add_run_test(${impl} onegpu_w${world}_${routing}_t${tokens} 120 --one-gpu
          ${small} --ranks ${world} --routing ${routing} --tokens ${tokens} --seed ${world}${tokens})
      endforeach()
      epfuse_add_run_test(${impl} onegpu_w${world}_${routing}_uneven 120 --one-gpu
        ${small} --ranks ${world} --routing ${routing} --tokens ${uneven_${world}})
    endforeach()
    epfuse_add_run_test(${impl} onegpu_w${world}_clamp 120 --one-gpu
      ${small} --clamp 0.25 --ranks ${world} --tokens ${uneven_${world}})
    foreach(model dsv3 qwen3-30b mixtral)
      epfuse_add_run_test(${impl} onegpu_w${world}_${model} 600 --one-gpu
        --model ${model} --ranks ${world} --tokens 128 --verify-rows 8)
    endforeach()
    epfuse_add_run_test(${impl} onegpu_w${world}_vary200 300 --one-gpu
      ${small} --ranks ${world} --tokens 128 --iters 200 --vary --verify-every 10 --verify-rows 16)
  endforeach()
  foreach(experts 64 256)
    foreach(routing uniform one-rank dropped)
      epfuse_add_run_test(${impl} onegpu_w8_e${experts}_${routing} 120 --one-gpu
        --hidden 256 --intermediate 256 --experts ${experts} --topk 8 --ranks 8 --routing ${routing} --tokens 128)
    endforeach()
  endforeach()
  foreach(routing uniform one-rank)
    epfuse_add_run_test(${impl} onegpu_w16_${routing} 120 --one-gpu
      --hidden 256 --intermediate 256 --experts 64 --topk 8 --ranks 16 --routing ${routing} --tokens 64)
  endforeach()
  epfuse_add_run_test(${impl} onegpu_w16_vary200 300 --one-gpu
    --hidden 256 --intermediate 256 --experts 64 --topk 8 --ranks 16 --tokens 64 --iters 200 --vary --verify-every 10)
  if(impl STREQUAL "fused")  # two m-blocks an expert where the GEMMs cover the combine: Linear1 first at world 4
    epfuse_add_run_test(${impl} onegpu_w4_linear1_first 120 --one-gpu  # (task_map.h combine_wants_lag)
      --hidden 256 --intermediate 768 --experts 16 --topk 4 --ranks 4 --tokens 512,300,0,97)
  endif()
endfunction()

# epfuse_add_fp8_run_matrix(<impl> [WORLDS <n>...] [ONE_GPU_WORLDS <n>...]): `epfuse run --dtype fp8`
# against the FP8 float64 reference, as ctest entries run_<impl>_fp8_<case>: every routing and T in
# {0, 1, 7, 128} at each world (default 1, 2, 4; skipped where the machine has fewer GPUs), uneven T at
# world 2, UE8M0 scales, the clamp, the model shapes at world 1 (sampled rows), and consecutive calls with
# fresh routing; at each one-GPU world (run_<impl>_fp8_onegpu_w<n>_<case>, every rank on one GPU) every
# routing and T, uneven T, the clamp, one model shape and consecutive calls.
function(epfuse_add_fp8_run_matrix impl)
  cmake_parse_arguments(ARG "" "" "WORLDS;ONE_GPU_WORLDS" ${ARGN})
  if(NOT ARG_WORLDS)
    set(ARG_WORLDS 1 2 4)
  endif()
  set(small --hidden 256 --intermediate 384 --experts 16 --topk 4 --dtype fp8)
  foreach(world IN LISTS ARG_WORLDS)
    foreach(routing uniform skewed one-expert dropped one-rank)
      foreach(tokens 0 1 7 128)
        epfuse_add_run_test(${impl} fp8_w${world}_${routing}_t${tokens} 120
          ${small} --ranks ${world} --routing ${routing} --tokens ${tokens} --seed ${world}${tokens})
      endforeach()
    endforeach()
  endforeach()
  epfuse_add_run_test(${impl} fp8_w1_ue8m0 120 ${small} --scales ue8m0 --ranks 1 --tokens 128)
  # x quantised by the caller (TokenBatch::x_fp8, x itself null): the fused layer sends those bytes,
  # the unfused chain refuses it (expect_failure.sh, the error's text).
  if(impl STREQUAL "fused")
    foreach(scales fp32 ue8m0)
      epfuse_add_run_test(${impl} fp8_w1_xfp8_${scales} 120 ${small} --x-fp8 --scales ${scales} --ranks 1 --tokens 128)
    endforeach()
    epfuse_add_run_test(${impl} fp8_w1_xfp8_vary50 300
      ${small} --x-fp8 --ranks 1 --tokens 128 --iters 50 --vary --verify-every 10)
    epfuse_add_run_test(${impl} fp8_w1_xfp8_padded 120 --hidden 320 --intermediate 192 --experts 16 --topk 4
      --dtype fp8 --x-fp8 --ranks 1 --routing skewed --tokens 96)
    if(2 IN_LIST ARG_WORLDS)
      epfuse_add_run_test(${impl} fp8_w2_xfp8_uneven 120 ${small} --x-fp8 --ranks 2 --tokens 128,0)
    endif()
  else()
    add_test(NAME run_${impl}_fp8_w1_xfp8_refused COMMAND bash ${PROJECT_SOURCE_DIR}/tests/gpu/run/expect_failure.sh
      "not supported by the unfused chain" 60 $<TARGET_FILE:epfuse_cli> run --impl ${impl} ${small} --x-fp8 --ranks 1
      --tokens 16)
    set_tests_properties(run_${impl}_fp8_w1_xfp8_refused PROPERTIES
      SKIP_RETURN_CODE 77 RUN_SERIAL TRUE TIMEOUT 120 LABELS "gpu;run"
      ENVIRONMENT "EPFUSE_SKIP_IF_FEWER_GPUS=1;NCCL_NVLS_ENABLE=0")
  endif()
  epfuse_add_run_test(${impl} fp8_w1_clamp 120 ${small} --clamp 0.25 --ranks 1 --tokens 64)
  # Rows of several dispatch chunks, the last one 64 columns (as in the bf16 matrix), quantised by the
  # layer and, in the fused layer, by the caller.
  set(wide --hidden 4160 --intermediate 384 --experts 16 --topk 4 --dtype fp8)
  epfuse_add_run_test(${impl} fp8_w1_wide_t7 120 ${wide} --ranks 1 --tokens 7)
  if(impl STREQUAL "fused")
    epfuse_add_run_test(${impl} fp8_w1_xfp8_wide_t7 120 ${wide} --x-fp8 --ranks 1 --tokens 7)
  endif()
  if(2 IN_LIST ARG_WORLDS)
    epfuse_add_run_test(${impl} fp8_w2_uneven 120 ${small} --ranks 2 --tokens 128,0)
  endif()
  foreach(model dsv3 qwen3-30b mixtral)
    epfuse_add_run_test(${impl} fp8_w1_${model} 600 --model ${model} --dtype fp8 --ranks 1 --tokens 128 --verify-rows 8)
  endforeach()
  epfuse_add_run_test(${impl} fp8_w1_vary50 300
    ${small} --ranks 1 --tokens 128 --iters 50 --vary --verify-every 10 --verify-rows 16)
  set(uneven_2 128,0)
  set(uneven_4 128,0,7,1)
  set(uneven_8 128,0,7,1,96,33,0,5)
  set(model_2 qwen3-30b)
  set(model_4 dsv3)
  set(model_8 mixtral)
  foreach(world IN LISTS ARG_ONE_GPU_WORLDS)
    set(case fp8_onegpu_w${world})
    foreach(routing uniform skewed one-expert dropped one-rank)
      foreach(tokens 0 1 7 128)
        epfuse_add_run_test(${impl} ${case}_${routing}_t${tokens} 120 --one-gpu
          ${small} --ranks ${world} --routing ${routing} --tokens ${tokens} --seed ${world}${tokens})
      endforeach()
    endforeach()
    epfuse_add_run_test(${impl} ${case}_uneven 120 --one-gpu ${small} --ranks ${world} --tokens ${uneven_${world}})
    epfuse_add_run_test(${impl} ${case}_clamp 120 --one-gpu ${small} --clamp 0.25 --ranks ${world} --tokens ${uneven_${world}})
    epfuse_add_run_test(${impl} ${case}_${model_${world}} 600 --one-gpu
      --model ${model_${world}} --dtype fp8 --ranks ${world} --tokens 128 --verify-rows 8)
    epfuse_add_run_test(${impl} ${case}_vary50 300 --one-gpu
      ${small} --ranks ${world} --tokens 128 --iters 50 --vary --verify-every 10 --verify-rows 16)
    if(impl STREQUAL "fused")  # x quantised by the caller, sent to the peers as it is
      epfuse_add_run_test(${impl} ${case}_xfp8 120 --one-gpu ${small} --x-fp8 --ranks ${world} --routing one-rank
        --tokens ${uneven_${world}})
      epfuse_add_run_test(${impl} ${case}_xfp8_wide 120 --one-gpu ${wide} --x-fp8 --ranks ${world}
        --tokens ${uneven_${world}})
    endif()
    epfuse_add_run_test(${impl} ${case}_wide 120 --one-gpu ${wide} --ranks ${world} --tokens ${uneven_${world}})
  endforeach()
  if(impl STREQUAL "fused" AND 4 IN_LIST ARG_ONE_GPU_WORLDS)  # the same for FP8, whose line is I = 1366
    epfuse_add_run_test(${impl} fp8_onegpu_w4_linear1_first 120 --one-gpu
      --hidden 256 --intermediate 1536 --experts 16 --topk 4 --dtype fp8 --ranks 4 --tokens 512,300,0,97)
  endif()
endfunction()

# epfuse_add_padded_run_matrix(<impl> [ONE_GPU]): layers whose H and I are multiples of 64 but not of
# the kernels' tiles, which run zero-padded (src/padding/padding.h), as ctest entries
# run_<impl>_padded_<case>: H 320 / I 192 (one 64-wide block in each, and for the fused FP8 tile H
# padded to 512) in bf16 and FP8 (both scale formats), every routing at T = 128 and T = 7 at world 1,
# uneven T at world 2 (skipped with one GPU), consecutive calls with fresh T (the staging rows reused),
# and a gpt-oss-sized layer (H = I = 2880); with ONE_GPU also worlds 2 and 4 on one GPU.
function(epfuse_add_padded_run_matrix impl)
  cmake_parse_arguments(ARG "ONE_GPU" "" "" ${ARGN})
  set(odd --hidden 320 --intermediate 192 --experts 16 --topk 4)
  foreach(dtype bf16 fp8)
    foreach(routing uniform skewed one-expert dropped one-rank)
      epfuse_add_run_test(${impl} padded_${dtype}_w1_${routing}_t128 120
        ${odd} --dtype ${dtype} --ranks 1 --routing ${routing} --tokens 128)
    endforeach()
    epfuse_add_run_test(${impl} padded_${dtype}_w1_t7 120 ${odd} --dtype ${dtype} --ranks 1 --tokens 7)
    epfuse_add_run_test(${impl} padded_${dtype}_w2_uneven 120 ${odd} --dtype ${dtype} --ranks 2 --tokens 128,0)
    epfuse_add_run_test(${impl} padded_${dtype}_w1_vary50 300
      ${odd} --dtype ${dtype} --ranks 1 --tokens 128 --iters 50 --vary --verify-every 10)
    epfuse_add_run_test(${impl} padded_${dtype}_w1_2880 600 --hidden 2880 --intermediate 2880 --experts 32 --topk 4
      --dtype ${dtype} --ranks 1 --tokens 256 --verify-rows 16)
    if(ARG_ONE_GPU)
      epfuse_add_run_test(${impl} padded_${dtype}_onegpu_w2_uniform_t128 120 --one-gpu
        ${odd} --dtype ${dtype} --ranks 2 --tokens 128)
      epfuse_add_run_test(${impl} padded_${dtype}_onegpu_w4_uneven 120 --one-gpu
        ${odd} --dtype ${dtype} --ranks 4 --routing one-rank --tokens 128,0,7,1)
    endif()
  endforeach()
  epfuse_add_run_test(${impl} padded_fp8_w1_ue8m0 120 ${odd} --dtype fp8 --scales ue8m0 --ranks 1 --tokens 128)
endfunction()

# epfuse_add_fault_run_tests(<impl>): `epfuse run` with EPFUSE_FAULT (src/common/fault.h) making the last
# rank misbehave in call 2 of 4, as ctest entries run_<impl>_fault_<where>_<kind>: each must exit
# non-zero (not 77) within its limit and print the line that names the failure (expect_failure.sh).
# Fused (with kind=hang at each point): one-GPU at world 4 and one process per GPU at world 2 (skipped
# with fewer GPUs). Unfused (NCCL
# only): the kinds whose first line is certain, at world 2, and bad_ids at world 1; a peer's skip and
# stall are test_gpu_unfused_faults_*'s (a collective timeout of 10 s here bounds what they leave).
function(epfuse_add_fault_run_test impl name ranks fault regex)
  set(test run_${impl}_fault_${name})
  add_test(NAME ${test} COMMAND bash ${PROJECT_SOURCE_DIR}/tests/gpu/run/expect_failure.sh "${regex}" 60
    $<TARGET_FILE:epfuse_cli> run --impl ${impl} ${ARGN} --hidden 256 --intermediate 256 --experts 16 --topk 4
    --ranks ${ranks} --tokens 64 --iters 4)
  set(env "EPFUSE_SKIP_IF_FEWER_GPUS=1;NCCL_NVLS_ENABLE=0;EPFUSE_TIMEOUT_MS=1000;EPFUSE_FAULT=${fault}")
  if(impl STREQUAL "unfused")
    list(APPEND env "EPFUSE_COLLECTIVE_TIMEOUT_MS=10000")  # the chain's bound (its waits are NCCL's)
  endif()
  set_tests_properties(${test} PROPERTIES
    SKIP_RETURN_CODE 77 RUN_SERIAL TRUE TIMEOUT 90 LABELS "gpu;run;fault" ENVIRONMENT "${env}")
endfunction()

function(epfuse_add_fault_run_tests impl)
  foreach(where onegpu_w4 w2)
    if(where STREQUAL "onegpu_w4")
      set(ranks 4)
      set(flags --one-gpu)
    else()
      set(ranks 2)
      set(flags)
    endif()
    math(EXPR last "${ranks} - 1")
    set(timed_out "rank 0: timed out in [a-z0-9 ]+ waiting for the count message of rank ${last}")
    epfuse_add_fault_run_test(${impl} ${where}_skip ${ranks} "rank=${last},kind=skip,call=2" "${timed_out}" ${flags})
    epfuse_add_fault_run_test(${impl} ${where}_stall ${ranks} "rank=${last},kind=stall,call=2" "${timed_out}" ${flags})
    if(where STREQUAL "onegpu_w4")
      # Every rank's error is printed: the peers' name the rank that threw (their kernels time out).
      set(threw "${timed_out}")
      set(bad "rank 0: rank ${last} reported invalid input")
    else()
      # The launcher stops the other ranks as soon as the faulty one exits: its own line is certain.
      set(threw "rank ${last}: EPFUSE_FAULT: throw in forward call 2")
      set(bad "rank [0-9]+: (rank ${last} reported invalid input|topk_idx.* is not a valid expert id)")
    endif()
    epfuse_add_fault_run_test(${impl} ${where}_throw ${ranks} "rank=${last},kind=throw,call=2" "${threw}" ${flags})
    epfuse_add_fault_run_test(${impl} ${where}_bad_ids ${ranks} "rank=${last},kind=bad_ids,call=2" "${bad}" ${flags})
    epfuse_add_fault_run_test(${impl} ${where}_exit ${ranks} "rank=${last},kind=exit,call=2"
      "rank ${last}: EPFUSE_FAULT: exit in forward call 2" ${flags})
    # kind=hang at each point inside the kernel (docs/fused_design.md, the EPFUSE_FAULT table): the wait
    # that expires first on some rank (either of two where, with every rank's 64 tokens, two start
    # together); producer and scheduler stop the producer warps of the FP8 kernel.
    set(any "rank [0-9]+: timed out in [a-z0-9 ]+ waiting for")
    set(hang "rank=${last},kind=hang,call=2,at")
    epfuse_add_fault_run_test(${impl} ${where}_hang_publish ${ranks} "${hang}=publish"
      "${any} the count message of rank ${last}" ${flags})
    epfuse_add_fault_run_test(${impl} ${where}_hang_dispatch ${ranks} "${hang}=dispatch"
      "${any} (arrivals of local expert|output tiles of token)" ${flags})
    epfuse_add_fault_run_test(${impl} ${where}_hang_collect ${ranks} "${hang}=collect"
      "${any} (this rank.s expert plan|output tiles of token)" ${flags})
    epfuse_add_fault_run_test(${impl} ${where}_hang_producer ${ranks} "${hang}=producer"
      "${any} (the operand pipeline of GEMM tile|output tiles of token)" ${flags} --dtype fp8)
    epfuse_add_fault_run_test(${impl} ${where}_hang_scheduler ${ranks} "${hang}=scheduler"
      "rank ${last}: timed out in [a-z0-9 ]+ waiting for the next task from this CTA.s producer warps" ${flags} --dtype fp8)
  endforeach()
endfunction()

function(epfuse_add_unfused_fault_run_tests)
  set(bad_id "topk_idx\\[0\\]\\[0\\] = 2139062143 out of range")
  epfuse_add_fault_run_test(unfused w1_bad_ids 1 "rank=0,kind=bad_ids,call=2" "rank 0: ${bad_id}")
  epfuse_add_fault_run_test(unfused w2_bad_ids 2 "rank=1,kind=bad_ids,call=2" "rank 1: ${bad_id}")
  epfuse_add_fault_run_test(unfused w2_throw 2 "rank=1,kind=throw,call=2"
    "rank 1: EPFUSE_FAULT: throw in forward call 2 \\(thrown before the counts exchange\\)")
  epfuse_add_fault_run_test(unfused w2_exit 2 "rank=1,kind=exit,call=2" "rank 1: EPFUSE_FAULT: exit in forward call 2")
  epfuse_add_fault_run_test(unfused w2_fail_create 2 "rank=1,kind=fail_create"
    "rank 1: EPFUSE_FAULT: fail_create: the unfused layer's allocation failed \\(injected\\)")
endfunction()
