# The CUDA VMM provider's tests, over the driver double (included by tests/alloc/CMakeLists.txt
# when the toolkit is found). The small device makes out-of-memory reachable.
wl_add_cunit_test(test_alloc_vmm
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_vmm.c
  LIBS wlalloc_static ${CMAKE_DL_LIBS}
  LABELS unit alloc
  ENV WLTEST_DRIVER=$<TARGET_FILE:wltest_cuda_driver> WLTEST_DEVICE_MEM=256M
      WLTEST_DEVICE_COUNT=2)
target_include_directories(test_alloc_vmm PRIVATE ${PROJECT_SOURCE_DIR}/tests/doubles
                                                  ${CUDAToolkit_INCLUDE_DIRS})
add_dependencies(test_alloc_vmm wltest_cuda_driver)
