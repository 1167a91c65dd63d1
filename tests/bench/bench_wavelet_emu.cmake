# wavelet-bench's cuda backend on the host emulation of the CUDA kernels (wavelet-bench-emu)
# against its cpu backend, same seed and data, --mode single: the MLP, the CNN and the residual
# CNN for a few steps at small batches. The kernels sum in another order, so the two agree within
# tolerances: the first step's loss (the forward pass alone) within 1e-4, the last step's loss
# and the test loss within 2e-3, the test accuracy within 2 samples, and every final weight
# within the learning rate (1e-3: Adam moves a weight by about that much a step at most). The
# loss must fall on both. Besides: --backend auto finds the emulated device (the probe runs in a
# child); the emulation reports no misuse (its "emu:" lines: a launch past sm_90's limits, a copy
# outside an allocation, a double free, a dead stream); the largest batch's launch
# configurations pass sm_90's limits (WAVELET_EMU_CHECK_ONLY); and when the emulated device's
# memory runs out (WAVELET_EMU_DEVICE_MEMORY) the replica fails with a clear out-of-memory line.
# Real Fashion-MNIST when installed, else synthetic data.
# Usage: cmake -DBENCH=<wavelet-bench-emu> -DDIFF=<wb-weights-diff> -DWORK=<dir> [-DDATA=...] -P
# this.
cmake_minimum_required(VERSION 3.25)
if(NOT BENCH OR NOT DIFF OR NOT WORK)
  message(FATAL_ERROR "pass -DBENCH=<wavelet-bench-emu> -DDIFF=<wb-weights-diff> -DWORK=<dir>")
endif()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(data synthetic)
if(DATA)
  set(data ${DATA}) # -DDATA=synthetic tries the other kind
elseif(EXISTS /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz)
  set(data /usr/share/datasets/fashion-mnist)
endif()
message(STATUS "data: ${data}")
set(common --mode single --data ${data} --train-samples 1024 --seed 1 --threads 1 --quiet --json)

include(${CMAKE_CURRENT_LIST_DIR}/run_bench.cmake)

# raw(<out> <json> <key>): a number as the JSON prints it (string(JSON) would reformat it as a
# double); one replica, so the first match is its.
function(raw out json key)
  if(NOT json MATCHES "\"${key}\":([-0-9.]+)")
    message(FATAL_ERROR "no ${key} in ${json}")
  endif()
  set(${out} ${CMAKE_MATCH_1} PARENT_SCOPE)
endfunction()

# The JSON prints these with 5 decimals: as integers in units of 1e-5.
function(fixed5 out value)
  if(NOT value MATCHES "^[0-9]+\\.[0-9][0-9][0-9][0-9][0-9]$")
    message(FATAL_ERROR "expected a number with 5 decimals, got '${value}'")
  endif()
  string(REPLACE "." "" v "${value}")
  string(REGEX REPLACE "^0+([0-9])" "\\1" v "${v}")
  set(${out} ${v} PARENT_SCOPE)
endfunction()

# near(<what> <a> <b> <tolerance in 1e-5>): fails unless |a - b| is within it.
function(near what a b tol)
  fixed5(x ${a})
  fixed5(y ${b})
  math(EXPR d "${x} - ${y}")
  if(d LESS 0)
    math(EXPR d "-${d}")
  endif()
  if(d GREATER tol)
    message(FATAL_ERROR "${what}: cpu ${a}, cuda ${b}: differ by more than ${tol}e-5")
  endif()
endfunction()

# compare(<model> <cuda backend argument> <weights' tolerance> <args>...): the cpu run and the
# cuda run.
function(compare model cuda wtol)
  run(c --backend cpu --model ${model} ${common} ${ARGN} --save-weights ${WORK}/${model}-cpu)
  run(g --backend ${cuda} --model ${model} ${common} ${ARGN} --save-weights ${WORK}/${model}-cuda)
  if(NOT c_rc EQUAL 0 OR NOT g_rc EQUAL 0)
    message(FATAL_ERROR "${model}: exit ${c_rc} (cpu) / ${g_rc} (cuda)\n${c_err}\n${g_err}")
  endif()
  string(JSON be GET "${g_out}" backend)
  if(NOT be STREQUAL "cuda")
    message(FATAL_ERROR "${model}: --backend ${cuda} ran on ${be}, expected the emulated cuda")
  endif()
  if(g_err MATCHES "emu: [^\n]*")
    message(FATAL_ERROR "${model}: the emulation reports: ${CMAKE_MATCH_0}\n${g_err}")
  endif()
  foreach(k first_loss last_loss test_loss test_accuracy)
    raw(${k}_c "${c_out}" ${k})
    raw(${k}_g "${g_out}" ${k})
  endforeach()
  string(JSON samples GET "${c_out}" test_samples)
  math(EXPR acc_tol "200000 / ${samples}") # 2 samples, in 1e-5
  message(STATUS "${model}: loss ${first_loss_c} -> ${last_loss_c} (cpu), "
                 "${first_loss_g} -> ${last_loss_g} (cuda); test accuracy ${test_accuracy_c} / "
                 "${test_accuracy_g}, loss ${test_loss_c} / ${test_loss_g}")
  near("${model} first step's loss" ${first_loss_c} ${first_loss_g} 10)
  near("${model} last step's loss" ${last_loss_c} ${last_loss_g} 200)
  near("${model} test loss" ${test_loss_c} ${test_loss_g} 200)
  near("${model} test accuracy" ${test_accuracy_c} ${test_accuracy_g} ${acc_tol})
  if(NOT last_loss_c LESS first_loss_c OR NOT last_loss_g LESS first_loss_g)
    message(FATAL_ERROR "${model}: the loss did not fall (cpu ${first_loss_c} -> ${last_loss_c}, "
                        "cuda ${first_loss_g} -> ${last_loss_g})")
  endif()
  execute_process(COMMAND ${DIFF} ${WORK}/${model}-cpu.0 ${WORK}/${model}-cuda.0 ${wtol}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${model}: weights, cpu against cuda: ${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${model}: the final weights differ: ${out}${err}")
  endif()
  string(JSON peak GET "${g_out}" replica_peak_bytes)
  set(${model}_peak ${peak} PARENT_SCOPE)
endfunction()

compare(mlp auto 1e-3 --optimizer adam --batch 32 --steps 12 --test-samples 200)
compare(cnn cuda 1e-4 --optimizer sgd --batch 16 --steps 6 --test-samples 64)
compare(resnet cuda 1e-4 --optimizer sgd --batch 8 --steps 5 --test-samples 32)

# The launches of the largest batch (4096), sized as for a real H100/H200, checked and not run.
foreach(model cnn resnet)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env WAVELET_EMU_CHECK_ONLY=1 ${BENCH} --backend cuda
                          --model ${model} --mode single --data synthetic --batch 4096 --steps 1
                          --train-samples 4096 --test-samples 4096 --quiet --json
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 200)
  if(NOT rc EQUAL 0 OR err MATCHES "refused" OR NOT err MATCHES "emu: checked")
    message(FATAL_ERROR "${model} at batch 4096, launches checked only: exit ${rc}\n${err}")
  endif()
endforeach()

# The emulated device holds just less than the MLP's peak: the step fails where it peaks, with
# one line naming the request, and frees what it took.
execute_process(COMMAND ${CMAKE_COMMAND} -E env WAVELET_EMU_DEVICE_MEMORY=${mlp_peak} ${BENCH}
                        --backend cuda --model mlp ${common} --batch 32 --steps 12
                        --test-samples 200
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 200)
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "device memory ${mlp_peak}: exit ${rc}, expected 1 (out of memory)\n${err}")
endif()
string(JSON st GET "${out}" per_replica 0 status)
if(NOT st STREQUAL "OOM" OR err MATCHES "emu: "
   OR NOT err MATCHES "replica 0 \\(pid [0-9]+\\): out of memory at step 1, in the [a-z ()]+ of [a-z0-9.]+: cannot allocate [^\n]*cudaMallocAsync: out of memory")
  message(FATAL_ERROR "device memory ${mlp_peak}: status ${st}, expected a clear OOM:\n${err}")
endif()
