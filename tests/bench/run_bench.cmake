# run(<prefix> <args>...): runs ${BENCH} with the arguments; sets <prefix>_rc, <prefix>_out and
# <prefix>_err in the caller. A hang (200 s) fails the test. Included by the bench scripts.
function(run p)
  execute_process(COMMAND ${BENCH} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err TIMEOUT 200)
  if(rc MATCHES "timeout|Process terminated")
    get_filename_component(name "${BENCH}" NAME)
    message(FATAL_ERROR "${name} ${ARGN}: did not finish (${rc})\n${err}")
  endif()
  set(${p}_rc "${rc}" PARENT_SCOPE)
  set(${p}_out "${out}" PARENT_SCOPE)
  set(${p}_err "${err}" PARENT_SCOPE)
endfunction()
