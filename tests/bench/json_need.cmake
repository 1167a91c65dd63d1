# The JSON checks the bench tests share (include after execute_process put the bench's stdout in
# `out`): json_object() stops unless it is one JSON object; need(<types> <key>...) unless the
# member exists with one of the types ("NUMBER", "STRING|NULL", ...). Both show the output.
function(json_object)
  string(JSON _type ERROR_VARIABLE _e TYPE "${out}")
  if(_e OR NOT _type STREQUAL "OBJECT")
    message(FATAL_ERROR "stdout is not one JSON object (${_e}):\n${out}")
  endif()
endfunction()

function(need type)
  string(JSON _t ERROR_VARIABLE _e TYPE "${out}" ${ARGN})
  if(_e)
    message(FATAL_ERROR "JSON lacks ${ARGN}: ${_e}\n${out}")
  endif()
  if(NOT _t MATCHES "^(${type})$")
    message(FATAL_ERROR "JSON ${ARGN} is ${_t}, expected ${type}\n${out}")
  endif()
endfunction()
