# wavelet-bench --gpus on the cpu backend (ranks are processes, the all-reduce is in shared
# memory): ranks finish with identical weights and a falling loss, alone and under tick-tock;
# 2 ranks at batch B end where 1 rank at batch 2B ends; a killed rank makes the others stop with
# a clear line instead of hanging; several machines need cuda.
# Usage: cmake -DBENCH=path -DDIFF=path-to-wb-weights-diff -DWORK=dir -P this.
cmake_minimum_required(VERSION 3.25)
if(NOT BENCH OR NOT DIFF OR NOT WORK)
  message(FATAL_ERROR "pass -DBENCH=<wavelet-bench> -DDIFF=<wb-weights-diff> -DWORK=<dir>")
endif()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(common --backend cpu --model mlp --data synthetic --train-samples 1024 --test-samples 200
    --threads 1 --quiet)

include(${CMAKE_CURRENT_LIST_DIR}/run_bench.cmake)

# check_dp(<json> <ranks> <replicas>): every process ok, replica k's checksum the same on every
# rank, the loss falling, the all-reduce timed.
function(check_dp json ranks replicas)
  string(JSON ok GET "${json}" ok)
  string(JSON n GET "${json}" ranks)
  string(JSON same GET "${json}" weights_identical)
  string(JSON ar GET "${json}" allreduce_ms_per_step)
  if(NOT ok OR NOT n EQUAL ranks OR NOT same OR NOT ar GREATER 0)
    message(FATAL_ERROR "ok ${ok}, ranks ${n}, weights_identical ${same}, allreduce ${ar}:\n${json}")
  endif()
  math(EXPR last "${ranks} * ${replicas} - 1")
  foreach(i RANGE ${last})
    string(JSON st GET "${json}" per_replica ${i} status)
    string(JSON rk GET "${json}" per_replica ${i} rank)
    string(JSON k GET "${json}" per_replica ${i} replica)
    string(JSON cs GET "${json}" per_replica ${i} weights_checksum)
    string(JSON cs0 GET "${json}" per_replica ${k} weights_checksum)
    string(JSON l0 GET "${json}" per_replica ${i} first_loss)
    string(JSON l1 GET "${json}" per_replica ${i} last_loss)
    math(EXPR want_rank "${i} / ${replicas}")
    if(NOT st STREQUAL "ok" OR NOT rk EQUAL want_rank OR NOT cs STREQUAL cs0)
      message(FATAL_ERROR "process ${i}: status ${st}, rank ${rk}, checksum ${cs} (rank 0: ${cs0})")
    endif()
    if(NOT l1 LESS l0)
      message(FATAL_ERROR "process ${i}: the loss did not fall (${l0} -> ${l1})")
    endif()
  endforeach()
endfunction()

# Two ranks, one replica each.
run(a ${common} --gpus 2 --batch 32 --steps 40 --json)
if(NOT a_rc EQUAL 0)
  message(FATAL_ERROR "--gpus 2: exit ${a_rc}\n${a_err}")
endif()
check_dp("${a_out}" 2 1)
if(NOT a_err MATCHES "2 ranks \\(processes\\)" OR NOT a_err MATCHES "weights identical across ranks")
  message(FATAL_ERROR "--gpus 2: the table does not name the ranks or the weights:\n${a_err}")
endif()

# Tick-tock with 2 replicas on each of 2 ranks (--ranks is the same as --gpus): replica k of both
# ranks reduce together, the two replicas stay different models.
run(b ${common} --mode ticktock --replicas 2 --ranks 2 --batch 32 --steps 30 --json)
if(NOT b_rc EQUAL 0)
  message(FATAL_ERROR "ticktock --ranks 2: exit ${b_rc}\n${b_err}")
endif()
check_dp("${b_out}" 2 2)
string(JSON c0 GET "${b_out}" per_replica 0 weights_checksum)
string(JSON c1 GET "${b_out}" per_replica 1 weights_checksum)
if(c0 STREQUAL c1)
  message(FATAL_ERROR "ticktock --ranks 2: replicas 0 and 1 ended with the same weights")
endif()

# 2 ranks at batch 16 against 1 rank at batch 32, 8 steps, same seed: the same weights up to the
# order of the float sums (Adam and SGD); 1 rank at batch 16 lands elsewhere (the check bites).
foreach(opt adam sgd)
  run(p ${common} --gpus 2 --batch 16 --steps 8 --optimizer ${opt}
      --save-weights ${WORK}/two-${opt})
  run(q ${common} --batch 32 --steps 8 --optimizer ${opt} --save-weights ${WORK}/one-${opt})
  if(NOT p_rc EQUAL 0 OR NOT q_rc EQUAL 0)
    message(FATAL_ERROR "${opt}: exit ${p_rc} / ${q_rc}\n${p_err}\n${q_err}")
  endif()
  execute_process(COMMAND ${DIFF} ${WORK}/two-${opt}.0 ${WORK}/one-${opt}.0 1e-5
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${opt}, 2 ranks x 16 against 1 rank x 32: ${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${opt}: 2 ranks x 16 and 1 rank x 32 differ: ${out}${err}")
  endif()
endforeach()
# Uneven slices: 515 samples in global batches of 3 x 10 leave a last batch of 5, split 2/2/1
# and weighted 0.4/0.4/0.2; 18 steps cross it. SGD, so the comparison is tight.
set(uneven --backend cpu --model mlp --data synthetic --train-samples 515 --test-samples 100
    --threads 1 --quiet --optimizer sgd --steps 18)
run(p ${uneven} --gpus 3 --batch 10 --save-weights ${WORK}/three)
run(q ${uneven} --batch 30 --save-weights ${WORK}/one30)
execute_process(COMMAND ${DIFF} ${WORK}/three.0 ${WORK}/one30.0 1e-6 RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "sgd, 3 ranks x 10 against 1 rank x 30, a last batch of 5: ${out}")
if(NOT p_rc EQUAL 0 OR NOT q_rc EQUAL 0 OR NOT rc EQUAL 0)
  message(FATAL_ERROR "uneven slices: exit ${p_rc} / ${q_rc}, ${out}${err}\n${p_err}${q_err}")
endif()

run(r ${common} --batch 16 --steps 8 --optimizer adam --save-weights ${WORK}/one16)
execute_process(COMMAND ${DIFF} ${WORK}/two-adam.0 ${WORK}/one16.0 1e-5 RESULT_VARIABLE rc
                OUTPUT_VARIABLE out)
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "2 ranks x 16 against 1 rank x 16: expected a difference, got ${out}")
endif()

# Rank 1 killed before its 4th step: ranks 0 and 2 stop at that all-reduce, naming it; exit 1.
execute_process(COMMAND ${CMAKE_COMMAND} -E env WAVELET_BENCH_KILL_AT=1:3 ${BENCH} ${common}
                        --gpus 3 --batch 16 --steps 50 RESULT_VARIABLE rc OUTPUT_VARIABLE out
                        ERROR_VARIABLE err TIMEOUT 200)
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "a killed rank: exit ${rc}, expected 1\n${out}${err}")
endif()
foreach(want "rank 1 replica 0 \\(pid [0-9]+\\): killed by signal 9"
             "rank 0 replica 0 \\(pid [0-9]+\\): step 4: the all-reduce of replica 0 was abandoned: rank 1 failed or died"
             "rank 2 replica 0 \\(pid [0-9]+\\): step 4: the all-reduce of replica 0 was abandoned: rank 1 failed or died")
  if(NOT err MATCHES "${want}")
    message(FATAL_ERROR "a killed rank: no line matching '${want}' in:\n${err}")
  endif()
endforeach()

# Several machines need NCCL: one line, exit 1.
run(m ${common} --gpus 1 --nodes 2 --node 0 --nccl-id ${WORK}/id)
string(REGEX MATCH "^[^\n]*" first "${m_err}")
if(NOT m_rc EQUAL 1 OR NOT first MATCHES "^wavelet-bench: --nodes 2: .*need --backend cuda")
  message(FATAL_ERROR "cpu --nodes 2: exit ${m_rc}, first line '${first}'")
endif()
