# Bad arguments make wl-bench-alloc exit 2 with one line naming the argument, then the usage;
# --help exits 0. Usage: cmake -DBENCH=path -P this.
if(NOT BENCH)
  message(FATAL_ERROR "pass -DBENCH=<path to wl-bench-alloc>")
endif()

set(PROG wl-bench-alloc)
set(BAD_USAGE ON)
include(${CMAKE_CURRENT_LIST_DIR}/bad_args.cmake)

bad("--iterations: expected a whole number from 1 to [0-9]+, got 'abc'" --iterations abc)
bad("--iterations: expected a whole number from 1 to [0-9]+, got '0'" --iterations 0)
bad("--iterations: expected a whole number from 1 to [0-9]+, got '-3'" --iterations=-3)
bad("--iterations: expected a value" --iterations)
bad("--rounds: expected a whole number" --rounds 1000)
bad("--trace: expected dnn, random or all, got 'resnet'" --trace resnet)
bad("--seed: expected a whole number" --seed 12x)
bad("unknown argument '--bogus'" --quick --bogus)
bad("unknown argument 'extra'" extra)
bad("--json takes no value" --json=yes)

execute_process(COMMAND ${BENCH} --help RESULT_VARIABLE rc OUTPUT_VARIABLE out)
if(NOT rc EQUAL 0 OR NOT out MATCHES "^usage: wl-bench-alloc")
  message(FATAL_ERROR "wl-bench-alloc --help: exit ${rc}, stdout:\n${out}")
endif()
