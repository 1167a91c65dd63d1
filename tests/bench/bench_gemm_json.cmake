# A tiny wl-bench-gemm run (64^3 and the target size at 1 thread, no repetition time): stdout is
# one JSON object with the core OpenBLAS ran, whether that baseline counts, the target's verdict
# and every row's ratio and correctness. On a CPU with AVX2 the baseline must be a core with AVX2
# kernels (the bench re-runs itself with OPENBLAS_CORETYPE when OpenBLAS picks an old one), or
# the run must say it is not representative and claim nothing. Usage: cmake -DBENCH=path -P this.
if(NOT BENCH)
  message(FATAL_ERROR "pass -DBENCH=<path to wl-bench-gemm>")
endif()

execute_process(COMMAND ${BENCH} --sizes 64,1024 --threads 1 --min-time 0 --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "wl-bench-gemm --json exited with ${rc}:\n${out}${err}")
endif()
include(${CMAKE_CURRENT_LIST_DIR}/json_need.cmake)
json_object()

need(STRING openblas_core)
need(STRING openblas_core_detected)
need("STRING|NULL" openblas_coretype_set_by)
need(BOOLEAN baseline_representative)
need("BOOLEAN|NULL" target_met)
need(BOOLEAN ok)
need(NUMBER max_rel_diff_max)
string(JSON _n LENGTH "${out}" results)
if(NOT _n EQUAL 2)
  message(FATAL_ERROR "expected 2 result rows (64 and 1024 on 1 thread), got ${_n}\n${out}")
endif()
foreach(i 0 1)
  foreach(k ratio_vs_openblas gflops openblas_gflops max_rel_diff)
    need(NUMBER results ${i} ${k})
  endforeach()
  need(BOOLEAN results ${i} ok)
  string(JSON _ok GET "${out}" results ${i} ok)
  if(NOT _ok STREQUAL "ON")
    message(FATAL_ERROR "row ${i} is not ok, yet the exit was 0\n${out}")
  endif()
endforeach()

# The verdict follows the baseline: judged (true or false) only against a fitting core.
string(JSON _rep GET "${out}" baseline_representative)
string(JSON _tm TYPE "${out}" target_met)
if(_rep STREQUAL "ON" AND _tm STREQUAL "NULL")
  message(FATAL_ERROR "a representative baseline at 1024, but target_met is null\n${out}")
endif()
if(NOT _rep STREQUAL "ON" AND NOT _tm STREQUAL "NULL")
  message(FATAL_ERROR "target judged against an unrepresentative baseline\n${out}")
endif()

# An old core on a CPU with AVX2 must not pass as representative.
file(READ /proc/cpuinfo _cpu LIMIT 20000)
string(JSON _core GET "${out}" openblas_core)
string(TOLOWER "${_core}" _core)
if(_cpu MATCHES " avx2" AND _rep STREQUAL "ON"
   AND NOT _core MATCHES "^(haswell|zen|skylakex|cooperlake|sapphirerapids|excavator)$")
  message(FATAL_ERROR "OpenBLAS core ${_core} counted as representative on an AVX2 CPU\n${out}")
endif()
message(STATUS "OpenBLAS core ${_core} (representative: ${_rep})")

# Started through the loader (as under valgrind), /proc/self/exe is the loader: the bench must not
# re-run it, and says so when it would have; then nothing is claimed against the old core.
set(_ld /lib64/ld-linux-x86-64.so.2)
if(EXISTS ${_ld})
  execute_process(COMMAND ${_ld} ${BENCH} --sizes 64 --threads 1 --min-time 0 --json
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "wl-bench-gemm through ${_ld} exited with ${rc}:\n${out}${err}")
  endif()
  json_object()
  string(JSON _rep GET "${out}" baseline_representative)
  string(JSON _tm TYPE "${out}" target_met)
  if(NOT _rep STREQUAL "ON" AND (NOT err MATCHES "started through a loader" OR NOT _tm STREQUAL "NULL"))
    message(FATAL_ERROR "through the loader: an old core without the loader's line, or a verdict\n${out}${err}")
  endif()
endif()
