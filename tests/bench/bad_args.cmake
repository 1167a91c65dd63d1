# bad(<regex the first stderr line must match> <args>...): runs ${BENCH} with the arguments and
# fails the script unless it exits 2, its first stderr line starts with "${PROG}: " and matches
# the regex, and nothing went to stdout; with BAD_USAGE set, the usage must follow the message.
# Included by the benches' argument tests, which set BENCH and PROG.
function(bad expect)
  execute_process(COMMAND ${BENCH} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 2)
    message(FATAL_ERROR "${PROG} ${ARGN}: exit ${rc}, expected 2\n${err}")
  endif()
  string(REGEX MATCH "^[^\n]*" first "${err}")
  if(NOT first MATCHES "^${PROG}: " OR NOT first MATCHES "${expect}")
    message(FATAL_ERROR "${PROG} ${ARGN}: first line '${first}' does not match '${expect}'")
  endif()
  if(BAD_USAGE AND NOT err MATCHES "usage: ${PROG}")
    message(FATAL_ERROR "${PROG} ${ARGN}: no usage after the message")
  endif()
  if(NOT out STREQUAL "")
    message(FATAL_ERROR "${PROG} ${ARGN}: printed on stdout:\n${out}")
  endif()
endfunction()
