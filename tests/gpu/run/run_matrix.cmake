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
  # The clamped SwiGLU (seed 000), at a clamp the generated activations exceed.
  epfuse_add_run_test(${impl} w2_clamp 120 ${small} --clamp 0.25 --ranks 2 --tokens 64,33)
  # The model shapes of FACTS.md at modest T, sampled rows (the reference regenerates the experts).
  foreach(model dsv3 qwen3-30b mixtral)
    foreach(world 2 4)
      epfuse_add_run_test(${impl} w${world}_${model} 600
        --model ${model} --ranks ${world} --tokens 128 --verify-rows 8)
    endforeach()
  endforeach()
  # Many consecutive calls with fresh routing and token counts each call: no reset between calls.
  foreach(world 1 2 4)
    epfuse_add_run_test(${impl} w${world}_vary200 300
      ${small} --ranks ${world} --tokens 128 --iters 200 --vary --verify-every 10 --verify-rows 16)
  endforeach()
endfunction()
