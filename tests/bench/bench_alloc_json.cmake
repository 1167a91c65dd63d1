# Runs `wl-bench-alloc --quick --json` and checks that stdout is one JSON object with the keys
# the benchmark promises, and that the table goes to stderr. Usage: cmake -DBENCH=path -P this.
if(NOT BENCH)
  message(FATAL_ERROR "pass -DBENCH=<path to wl-bench-alloc>")
endif()

execute_process(COMMAND ${BENCH} --quick --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "wl-bench-alloc --quick --json exited with ${rc}:\n${err}")
endif()

include(${CMAKE_CURRENT_LIST_DIR}/json_need.cmake)
json_object()

# The headline figures, for the DNN trace.
foreach(k ns_per_op_p50 ns_per_op_p99 ratio_vs_malloc reserved_over_live_peak)
  need(NUMBER ${k})
endforeach()
need(STRING primary_trace)
need(BOOLEAN targets_met)
foreach(k ratio_vs_malloc reserved_over_live_peak)
  need(NUMBER targets ${k} max)
  need(NUMBER targets ${k} value)
  need(BOOLEAN targets ${k} met)
endforeach()
need(NUMBER timer overhead_ns)
need(STRING timer method)
need(BOOLEAN timer overhead_subtracted)

# Every trace, every allocator.
foreach(tr dnn random)
  foreach(k ns_per_op_p50 ns_per_op_p99 ratio_vs_malloc reserved_over_live_peak ops_measured)
    need(NUMBER traces ${tr} ${k})
  endforeach()
  foreach(v liballoc malloc)
    foreach(k ns_per_op_p50 ns_per_op_p99 alloc_ns_p50 free_ns_p50 ns_per_op_mean_untimed)
      need(NUMBER traces ${tr} ${v} ${k})
    endforeach()
  endforeach()
  need(NUMBER traces ${tr} liballoc physical_peak_bytes)
  need(NUMBER traces ${tr} liballoc live_peak_bytes)
  need(NULL traces ${tr} malloc reserved_over_live_peak)
endforeach()
need(BOOLEAN traces dnn targets ratio_vs_malloc met)
need(BOOLEAN traces dnn targets reserved_over_live_peak met)
need(BOOLEAN traces dnn targets_met)
foreach(k returned_bytes_per_iteration trim_ns_p50 cost_per_iteration_ns ns_per_op_p50)
  need(NUMBER traces dnn liballoc_trim ${k})
endforeach()

# The replay is the trace: liballoc's live peak is the trace's.
string(JSON _a GET "${out}" traces dnn live_peak_bytes)
string(JSON _b GET "${out}" traces dnn liballoc live_peak_bytes)
if(NOT _a STREQUAL _b)
  message(FATAL_ERROR "dnn live peak: trace ${_a}, liballoc ${_b}")
endif()

if(NOT err MATCHES "glibc malloc" OR NOT err MATCHES "ratio_vs_malloc")
  message(FATAL_ERROR "with --json the table should go to stderr; stderr was:\n${err}")
endif()

# Without --json: the table on stdout.
execute_process(COMMAND ${BENCH} --quick --trace dnn RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "liballoc \\+ trim" OR NOT out MATCHES "ratio_vs_malloc")
  message(FATAL_ERROR "wl-bench-alloc --quick --trace dnn (${rc}) printed no table:\n${out}${err}")
endif()
