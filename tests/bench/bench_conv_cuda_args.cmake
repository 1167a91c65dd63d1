# wl-bench-conv-cuda without a GPU: bad arguments exit 2 with one line naming the argument and
# nothing on stdout; --help exits 0; with no usable device it exits 77 (skipped); on the CUDA
# test doubles (a device, but no cuDNN named) an unloadable or wrong cuDNN library exits 77 with
# one line saying why. Usage: cmake -DBENCH=path [-DDOUBLES=dir] -P this.
if(NOT BENCH)
  message(FATAL_ERROR "pass -DBENCH=<path to wl-bench-conv-cuda>")
endif()

set(PROG wl-bench-conv-cuda)
include(${CMAKE_CURRENT_LIST_DIR}/bad_args.cmake)

bad("bad --reps '2' \\(a whole number from 3 to 1000\\)" --reps 2)
bad("bad --reps '1001'" --reps 1001)
bad("bad --reps '5x'" --reps 5x)
bad("--reps: expected a value" --json --reps)
bad("bad --shapes 'resnet.res9' \\(expected names from --help" --shapes r50.1x1,resnet.res9)
bad("bad --shapes ','" --shapes ,)
bad("bad --passes 'bwd' \\(fwd, bwd_data, bwd_filter" --passes fwd,bwd)
bad("--passes: expected a value" --passes)
bad("unknown or incomplete argument '--bogus'" --bogus)
bad("unknown or incomplete argument '--json=yes'" --json=yes)
# Arguments are checked before the device: a bad one is 2 even where 77 would follow.
bad("bad --reps '0'" --json --shapes cnn.conv2 --reps 0)

execute_process(COMMAND ${BENCH} --help RESULT_VARIABLE rc OUTPUT_VARIABLE out)
if(NOT rc EQUAL 0 OR NOT out MATCHES "^usage: wl-bench-conv-cuda" OR NOT out MATCHES "r50.1x1")
  message(FATAL_ERROR "wl-bench-conv-cuda --help: exit ${rc}, stdout:\n${out}")
endif()

# skipped(<regex for stderr> <env assignments>...): exit 77, one line on stderr, none on stdout.
function(skipped expect)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ${ARGN} ${BENCH} --json --reps 3
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
  if(NOT rc EQUAL 77)
    message(FATAL_ERROR "wl-bench-conv-cuda with ${ARGN}: exit ${rc}, expected 77 (skipped)\n"
                        "stdout: ${out}\nstderr: ${err}")
  endif()
  if(NOT err MATCHES "^wl-bench-conv-cuda: [^\n]*${expect}[^\n]*: skipped\n$")
    message(FATAL_ERROR "wl-bench-conv-cuda with ${ARGN}: stderr is not one line matching "
                        "'${expect}': '${err}'")
  endif()
  if(NOT out STREQUAL "")
    message(FATAL_ERROR "wl-bench-conv-cuda with ${ARGN}: printed on stdout:\n${out}")
  endif()
endfunction()

# No device: the real runtime with every device hidden (here there is no driver either).
skipped("no usable CUDA device \\(CUDA error [0-9]+\\)" CUDA_VISIBLE_DEVICES=-1)

if(DOUBLES)
  # The doubles' runtime reports a device, so the run reaches the cuDNN loader; the library it
  # is told to use does not exist, or is not cuDNN.
  set(dbl LD_LIBRARY_PATH=${DOUBLES} WLTEST_DEVICE_MEM=8G)
  skipped("cannot load cuDNN \\(/nonexistent/libcudnn.so.9\\)" ${dbl}
          WAVELET_CUDNN_LIB=/nonexistent/libcudnn.so.9)
  skipped("the library loaded as cuDNN lacks cudnnGetVersion" ${dbl}
          WAVELET_CUDNN_LIB=${DOUBLES}/libcudart.so.13)
endif()

if(DOUBLES AND FAKE)
  # fake(<mode> <expected row error> <shapes>): exit 1, one JSON object on stdout whose every
  # row is ok:false with that error, and one stderr line per row naming shape and pass.
  function(fake mode expect shapes nrows)
    execute_process(COMMAND ${CMAKE_COMMAND} -E env ${dbl} WAVELET_CUDNN_LIB=${FAKE}
                            WLTEST_FAKE_CUDNN=${mode} ${BENCH} --json --reps 3 --shapes ${shapes}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
    if(NOT rc EQUAL 1)
      message(FATAL_ERROR "fake cuDNN (${mode}): exit ${rc}, expected 1\n${out}\n${err}")
    endif()
    string(JSON n ERROR_VARIABLE jerr LENGTH "${out}" results)
    if(jerr OR NOT n EQUAL nrows)
      message(FATAL_ERROR "fake cuDNN (${mode}): ${nrows} results expected (${jerr}):\n${out}")
    endif()
    math(EXPR last "${n} - 1")
    foreach(i RANGE ${last})
      string(JSON ok GET "${out}" results ${i} ok)
      string(JSON why GET "${out}" results ${i} error)
      string(JSON shape GET "${out}" results ${i} shape)
      string(JSON pass GET "${out}" results ${i} pass)
      if(ok OR NOT why STREQUAL expect)
        message(FATAL_ERROR "fake cuDNN (${mode}): row ${i} ok=${ok} error '${why}', expected "
                            "'${expect}'\n${out}")
      endif()
      if(NOT err MATCHES "wl-bench-conv-cuda: ${shape} ${pass}: ${expect}")
        message(FATAL_ERROR "fake cuDNN (${mode}): no stderr line for ${shape} ${pass}:\n${err}")
      endif()
    endforeach()
    string(JSON met GET "${out}" summary target_met)
    string(JSON failed GET "${out}" summary failed_rows)
    string(JSON lib GET "${out}" cudnn_library)
    string(JSON math GET "${out}" math)
    if(met OR NOT failed EQUAL nrows OR NOT lib STREQUAL FAKE OR NOT math MATCHES "no TF32")
      message(FATAL_ERROR "fake cuDNN (${mode}): summary or header wrong:\n${out}")
    endif()
  endfunction()
  # Our kernels on the doubles leave the NaN the outputs are filled with: "differs". The input
  # layer (C = 1) has no bwd_data row.
  fake(fma "result differs from cuDNN's" r50.1x1,resnet.stem 5)
  # Only tensor-core algorithms on offer: none qualifies.
  fake(tensorop "CUDNN_STATUS_NOT_SUPPORTED" cnn.conv2 3)
endif()
