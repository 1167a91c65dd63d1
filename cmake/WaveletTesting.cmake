# wl_add_cunit_test(NAME SOURCES src... [LIBS lib...] [LABELS label...] [ENV var=value...]
#                   [SHARDS n])
# Builds one CUnit runner and registers it with ctest. Exit code 77 means skipped (e.g. no GPU).
# SHARDS n: registered as n tests, NAME and NAME_2 ... NAME_n, each running the runner with
# `--shard k/n` (its cases split in turn), so that a long runner does not make ctest -j wait for
# it alone.
pkg_check_modules(CUNIT REQUIRED IMPORTED_TARGET cunit)

function(wl_add_cunit_test name)
  cmake_parse_arguments(T "" "SHARDS" "SOURCES;LIBS;LABELS;ENV" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/common)
  target_link_libraries(${name} PRIVATE ${T_LIBS} PkgConfig::CUNIT Threads::Threads
                                        ${CMAKE_DL_LIBS})
  set(_tests ${name})
  if(T_SHARDS)
    add_test(NAME ${name} COMMAND ${name} --shard 1/${T_SHARDS})
    foreach(_k RANGE 2 ${T_SHARDS})
      add_test(NAME ${name}_${_k} COMMAND ${name} --shard ${_k}/${T_SHARDS})
      list(APPEND _tests ${name}_${_k})
    endforeach()
  else()
    add_test(NAME ${name} COMMAND ${name})
  endif()
  if(NOT T_LABELS)
    set(T_LABELS unit)
  endif()
  set_tests_properties(${_tests} PROPERTIES LABELS "${T_LABELS}" SKIP_RETURN_CODE 77 TIMEOUT 300)
  if(T_ENV)
    set_tests_properties(${_tests} PROPERTIES ENVIRONMENT "${T_ENV}")
  endif()
endfunction()

# wl_add_gvisor_variant(name): CUnit test `name` once more as `name_gvisor`, on a kernel that
# refuses open file description locks and makes membarrier slow (what gVisor does), emulated by
# preloading libwltest_gvisor.so: what we do about it is tested on every machine. The test sees
# WLTEST_GVISOR=1, and its runner (wl_test_main, tests/common/wltest.h) fails unless the library
# is in effect: ld.so only warns about a preload it cannot load.
function(wl_add_gvisor_variant name)
  if(NOT TARGET ${name} OR NOT TARGET wltest_gvisor)
    return()
  endif()
  add_test(NAME ${name}_gvisor COMMAND ${name})
  get_test_property(${name} LABELS _labels)
  get_test_property(${name} TIMEOUT _timeout)
  # A sanitizer's runtime objects to a library preloaded ahead of it.
  set_tests_properties(${name}_gvisor PROPERTIES LABELS "${_labels};gvisor" SKIP_RETURN_CODE 77
    TIMEOUT ${_timeout}
    ENVIRONMENT
    "LD_PRELOAD=$<TARGET_FILE:wltest_gvisor>;WLTEST_GVISOR=1;ASAN_OPTIONS=verify_asan_link_order=0")
  add_dependencies(${name} wltest_gvisor)
endfunction()
