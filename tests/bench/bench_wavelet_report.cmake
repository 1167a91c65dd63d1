# What wavelet-bench reports when a run goes wrong: a diverged loss stops the replica with an
# error and valid JSON (null, never "-nan"); weights that cannot be written leave the accuracy;
# a replica killed mid-run still shows the memory it reached and no loss it never measured. And
# the epochs completed (epochs_completed: samples over the training set, fractional), beside the
# epochs asked for (epochs: 0 with --steps).
# Usage: cmake -DBENCH=path -DWORK=dir -P this.
cmake_minimum_required(VERSION 3.25)
if(NOT BENCH OR NOT WORK)
  message(FATAL_ERROR "pass -DBENCH=<path to wavelet-bench> -DWORK=<scratch dir>")
endif()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
include(${CMAKE_CURRENT_LIST_DIR}/run_bench.cmake)
set(small --backend cpu --model mlp --data synthetic --train-samples 640 --test-samples 64
    --threads 1)

# json_get(<var> <json> <path>...): the value, failing the test on JSON cmake cannot parse.
function(json_get var json)
  string(JSON v ERROR_VARIABLE e GET "${json}" ${ARGN})
  if(e)
    message(FATAL_ERROR "${ARGN}: ${e}\n${json}")
  endif()
  set(${var} "${v}" PARENT_SCOPE)
endfunction()

# SGD at a learning rate of 10 diverges within a few steps: exit 1, the replica an error that
# says where, every float of the JSON readable.
run(d ${small} --steps 10 --optimizer sgd --lr 10 --schedule constant --quiet --json)
if(NOT d_rc EQUAL 1)
  message(FATAL_ERROR "diverged run: exit ${d_rc}, expected 1\n${d_out}\n${d_err}")
endif()
if(d_out MATCHES ":-?(nan|inf)")
  message(FATAL_ERROR "diverged run: a non-finite number in the JSON:\n${d_out}")
endif()
json_get(ok "${d_out}" ok)
json_get(st "${d_out}" per_replica 0 status)
json_get(msg "${d_out}" per_replica 0 message)
json_get(steps "${d_out}" per_replica 0 steps)
string(JSON tl TYPE "${d_out}" per_replica 0 test_loss)
string(JSON ll TYPE "${d_out}" per_replica 0 last_loss)
if(NOT tl STREQUAL "NULL" OR NOT ll STREQUAL "NULL")
  message(FATAL_ERROR "diverged run: test_loss ${tl}, last_loss ${ll}: expected null (never measured)")
endif()
if(ok OR NOT st STREQUAL "error" OR NOT msg MATCHES "^loss diverged at step ${steps} \\(" OR
   steps GREATER_EQUAL 10)
  message(FATAL_ERROR "diverged run: ok ${ok}, status ${st}, steps ${steps}, message '${msg}'")
endif()
if(NOT d_err MATCHES "replica 0 \\(pid [0-9]+\\): loss diverged at step ${steps}")
  message(FATAL_ERROR "diverged run: no line saying so on stderr:\n${d_err}")
endif()

# --save-weights whose file cannot be made at the end (PATH.0 is a directory; the directory
# check at the start passes): the line says so and the run exits 1, but the replica's training
# and accuracy stand.
file(MAKE_DIRECTORY ${WORK}/w.0)
run(s ${small} --steps 4 --quiet --json --save-weights ${WORK}/w)
json_get(ok "${s_out}" ok)
json_get(saved "${s_out}" weights_saved)
json_get(st "${s_out}" per_replica 0 status)
json_get(acc "${s_out}" per_replica 0 test_accuracy)
json_get(tacc "${s_out}" test_accuracy)
json_get(msg "${s_out}" per_replica 0 message)
if(NOT s_rc EQUAL 1 OR NOT ok OR saved OR NOT st STREQUAL "ok" OR NOT acc GREATER 0 OR
   NOT tacc EQUAL acc OR NOT msg MATCHES "^cannot write ${WORK}/w.0: ")
  message(FATAL_ERROR "unwritable weights: exit ${s_rc}, ok ${ok}, weights_saved ${saved}, "
                      "status ${st}, accuracy ${acc} / ${tacc}, message '${msg}'\n${s_err}")
endif()
if(NOT s_err MATCHES "replica 0: cannot write ${WORK}/w.0: ")
  message(FATAL_ERROR "unwritable weights: the table does not say so:\n${s_err}")
endif()
# 4 steps of 64 of 640 samples: 0.4 epochs completed, none asked for.
json_get(ep "${s_out}" epochs)
json_get(epc "${s_out}" epochs_completed)
json_get(epr "${s_out}" per_replica 0 epochs_completed)
if(NOT ep EQUAL 0 OR NOT epc EQUAL 0.4 OR NOT epr EQUAL 0.4)
  message(FATAL_ERROR "--steps 4: epochs ${ep}, epochs_completed ${epc} (replica ${epr}), "
                      "expected 0 and 0.4")
endif()
if(NOT s_err MATCHES "\nall +ok +0\\.400 ")
  message(FATAL_ERROR "--steps 4: the table's last line does not say 0.400 epochs:\n${s_err}")
endif()

# --eval-each-epoch with --quiet: the evaluations are in the JSON, and nothing on stderr but the
# table.
run(e ${small} --epochs 2 --batch 128 --eval-each-epoch --quiet --json)
string(JSON ne LENGTH "${e_out}" per_replica 0 epoch_test_accuracy)
if(NOT e_rc EQUAL 0 OR NOT ne EQUAL 2 OR e_err MATCHES "epoch [0-9]+ done")
  message(FATAL_ERROR "--eval-each-epoch --quiet: exit ${e_rc}, ${ne} evaluations:\n${e_err}")
endif()
json_get(ep "${e_out}" epochs)
json_get(epc "${e_out}" epochs_completed)
if(NOT ep EQUAL 2 OR NOT epc EQUAL 2)
  message(FATAL_ERROR "--epochs 2: epochs ${ep}, epochs_completed ${epc}")
endif()

# A replica killed before its 6th step of 50 (as a crash would): its peak, trough and waits are
# what it reached, its first loss (steps 1 to 5) measured, the last 10 % of the steps' loss and
# the test results null, '-' in the table.
execute_process(COMMAND ${CMAKE_COMMAND} -E env WAVELET_BENCH_KILL_AT=0:5 ${BENCH} ${small}
                        --steps 50 --batch 16 --quiet --json
                RESULT_VARIABLE k_rc OUTPUT_VARIABLE k_out ERROR_VARIABLE k_err TIMEOUT 200)
json_get(st "${k_out}" per_replica 0 status)
json_get(msg "${k_out}" per_replica 0 message)
json_get(peak "${k_out}" per_replica 0 peak_bytes)
json_get(trough "${k_out}" per_replica 0 trough_bytes)
json_get(first "${k_out}" per_replica 0 first_loss)
json_get(sps "${k_out}" per_replica 0 samples_per_s)
json_get(epr "${k_out}" per_replica 0 epochs_completed) # 5 steps of 16 of 640: 0.125
foreach(k mem_wait_s gate_wait_s last_loss test_accuracy test_loss)
  string(JSON ${k} TYPE "${k_out}" per_replica 0 ${k})
endforeach()
if(NOT k_rc EQUAL 1 OR NOT st STREQUAL "error" OR NOT msg MATCHES "killed by signal 9" OR
   NOT peak GREATER 0 OR NOT trough GREATER 0 OR NOT first GREATER 0 OR NOT sps GREATER 0 OR
   NOT mem_wait_s STREQUAL "NUMBER" OR NOT gate_wait_s STREQUAL "NUMBER" OR
   NOT last_loss STREQUAL "NULL" OR NOT test_accuracy STREQUAL "NULL" OR
   NOT test_loss STREQUAL "NULL" OR NOT epr EQUAL 0.125)
  message(FATAL_ERROR "killed replica: exit ${k_rc}, status ${st}, peak ${peak}, trough "
                      "${trough}, ${sps} samples/s, waits ${mem_wait_s}/${gate_wait_s}, losses "
                      "${first} -> ${last_loss}, test ${test_accuracy}/${test_loss}, "
                      "${epr} epochs:\n${k_out}")
endif()
if(NOT k_err MATCHES "\n0 +error +5 +0\\.125 +[0-9.]+ +[0-9.]+ [KM]iB +[0-9.]+ [KM]iB +[0-9.]+s +[0-9.]+s +- +-\n")
  message(FATAL_ERROR "killed replica: the table's line is not what it measured:\n${k_err}")
endif()
