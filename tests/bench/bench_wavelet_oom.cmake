# The point of Wavelet at a small size: two replicas of the residual CNN under a group budget
# of 1.25 x one replica's peak (tight, so that the ungated pair collides even when the machine's
# load lets one replica run a little ahead; at 1.6 x they sometimes drifted apart). Ungated (colocate) one of them fails cleanly with
# out-of-memory (a line naming the replica, the request and the budget); in tick-tock both
# finish within the budget. The traces they write are readable by wavelet-trace.
# Usage: cmake -DBENCH=path -DTRACE=path -DWORK=dir -P this.
cmake_minimum_required(VERSION 3.25)
if(NOT BENCH OR NOT WORK)
  message(FATAL_ERROR "pass -DBENCH=<path to wavelet-bench> -DWORK=<scratch dir>")
endif()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/colocate ${WORK}/ticktock)
set(common --backend cpu --model resnet --batch 8 --data synthetic --train-samples 256
           --test-samples 32 --quiet --json)

execute_process(COMMAND ${BENCH} ${common} --mode single --steps 2 RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "single: exit ${rc}\n${err}")
endif()
string(JSON peak GET "${out}" replica_peak_bytes)
math(EXPR limit "${peak} * 125 / 100")
message(STATUS "single-replica peak ${peak} bytes; group limit ${limit}")

execute_process(COMMAND ${BENCH} ${common} --mode colocate --replicas 2 --steps 4
                        --mem-limit ${limit} --trace-dir ${WORK}/colocate
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "colocate under ${limit}: exit ${rc}, expected 1 (out of memory)\n${err}")
endif()
string(JSON failed GET "${out}" failed)
string(JSON all_ok GET "${out}" ok)
if(NOT failed EQUAL 1 OR all_ok)
  message(FATAL_ERROR "colocate: expected exactly one replica to fail, got ${failed}\n${out}")
endif()
if(NOT err MATCHES "wavelet-bench: replica [01] \\(pid [0-9]+\\): out of memory at step 1, in the [a-z ()]+ of [a-z0-9.]+: cannot allocate [^\n]*limit [^\n]*the group held")
  message(FATAL_ERROR "colocate: no clear out-of-memory line in:\n${err}")
endif()
string(JSON peak_all GET "${out}" peak_bytes)
if(peak_all GREATER limit)
  message(FATAL_ERROR "colocate: combined peak ${peak_all} over the limit ${limit}")
endif()

execute_process(COMMAND ${BENCH} ${common} --mode ticktock --replicas 2 --steps 4
                        --mem-limit ${limit} --trace-dir ${WORK}/ticktock
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ticktock under ${limit}: exit ${rc}, expected 0\n${err}\n${out}")
endif()
foreach(i 0 1)
  string(JSON st GET "${out}" per_replica ${i} status)
  string(JSON steps GET "${out}" per_replica ${i} steps)
  if(NOT st STREQUAL "ok" OR NOT steps EQUAL 4)
    message(FATAL_ERROR "ticktock replica ${i}: ${st} after ${steps} steps\n${out}")
  endif()
endforeach()
string(JSON peak_all GET "${out}" peak_bytes)
if(peak_all GREATER limit OR peak_all LESS_EQUAL peak)
  message(FATAL_ERROR "ticktock: combined peak ${peak_all}, expected above one replica's "
                      "(${peak}) and within the limit (${limit})")
endif()

if(TRACE)
  execute_process(COMMAND ${TRACE} report ${WORK}/ticktock/replica-0.wlt
                          ${WORK}/ticktock/replica-1.wlt --svg ${WORK}/ticktock.svg
                  RESULT_VARIABLE rc OUTPUT_VARIABLE rep ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT rep MATCHES "iterations +4 \\(markers" OR NOT EXISTS ${WORK}/ticktock.svg)
    message(FATAL_ERROR "wavelet-trace report on the ticktock traces: exit ${rc}\n${rep}\n${err}")
  endif()
endif()

# A budget that holds one replica's parameters (the MLP's weights, gradients and optimizer state,
# 2.7 MiB) but not two: the replica left without them fails in the setup's few seconds, however
# long the allocation timeout, since the other waits at the start barrier holding its own (it
# waited out the whole timeout before). The bound here is 12 times the setup's 5 s.
execute_process(COMMAND ${BENCH} --backend cpu --model mlp --batch 32 --data synthetic
                        --train-samples 256 --test-samples 32 --quiet --mode colocate --replicas 2
                        --steps 2 --mem-limit 4M --alloc-timeout-ms 3600000
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
if(NOT rc EQUAL 1 OR NOT err MATCHES "replica [01] \\(pid [0-9]+\\): out of memory for the parameters: cannot allocate")
  message(FATAL_ERROR "colocate, parameters for one: exit '${rc}', expected 1 with a line "
                      "saying the parameters do not fit\n${err}")
endif()
