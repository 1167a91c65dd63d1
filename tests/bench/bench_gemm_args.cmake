# Bad arguments make wl-bench-gemm exit 2 with one line naming the argument and nothing on
# stdout; --help exits 0. Usage: cmake -DBENCH=path -P this.
if(NOT BENCH)
  message(FATAL_ERROR "pass -DBENCH=<path to wl-bench-gemm>")
endif()

set(PROG wl-bench-gemm)
include(${CMAKE_CURRENT_LIST_DIR}/bad_args.cmake)

bad("bad --sizes '0'" --sizes 0)
bad("bad --sizes '64,x'" --sizes 64,x)
bad("bad --sizes '20000'" --sizes 20000)
bad("bad --threads 'many'" --threads many)
bad("bad --threads '0'" --threads 0)
bad("bad --min-time '-1'" --min-time -1)
bad("bad --trans 'NX'" --trans NX)
bad("unknown or incomplete argument '--sizes'" --sizes)
bad("unknown or incomplete argument '--bogus'" --bogus)

execute_process(COMMAND ${BENCH} --help RESULT_VARIABLE rc OUTPUT_VARIABLE out)
if(NOT rc EQUAL 0 OR NOT out MATCHES "^usage: wl-bench-gemm")
  message(FATAL_ERROR "wl-bench-gemm --help: exit ${rc}, stdout:\n${out}")
endif()
