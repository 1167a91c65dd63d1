# cmake --install: the public headers, the libraries, wavelet.pc and a CMake package config.
include(CMakePackageConfigHelpers)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/wavelet DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")

# Each library directory appends its installable targets to this global list.
get_property(_wl_install_targets GLOBAL PROPERTY WAVELET_INSTALL_TARGETS)
install(TARGETS ${_wl_install_targets} EXPORT waveletTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The pinned arena's jemalloc (dynamic flavour, cmake/WaveletJemalloc.cmake): libwavelet.so loads
# it from its own directory.
get_property(_wl_je_so GLOBAL PROPERTY WL_JEMALLOC_SO)
if(_wl_je_so AND TARGET wavelet)
  install(PROGRAMS ${_wl_je_so} DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
install(EXPORT waveletTargets NAMESPACE wavelet:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/wavelet)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/waveletConfig.cmake.in
  ${CMAKE_BINARY_DIR}/waveletConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/wavelet)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/waveletConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/waveletConfig.cmake ${CMAKE_BINARY_DIR}/waveletConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/wavelet)

# pkg-config: the libraries present in this build.
get_property(_wl_pc_libs GLOBAL PROPERTY WAVELET_PC_LIBS)
list(JOIN _wl_pc_libs " " WAVELET_PC_LIBS)
# From LIBDIR/pkgconfig back up to the prefix: as many levels as LIBDIR has, plus one (Debian's
# lib/x86_64-linux-gnu is two; a fixed ../.. named /usr/lib the prefix there).
file(RELATIVE_PATH WAVELET_PC_UP /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" WAVELET_PC_UP "${WAVELET_PC_UP}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/wavelet.pc.in ${CMAKE_BINARY_DIR}/wavelet.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/wavelet.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
