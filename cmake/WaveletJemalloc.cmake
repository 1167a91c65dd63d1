# wl_jemalloc_private: the private jemalloc of the pinned-host arena (interpose/src/pinned.c), in
# one of two flavours. Either way only calls spelled wl__je_* reach it: linked as is, Debian's
# jemalloc (built without a symbol prefix) would take over malloc, free, calloc... of the library
# and of the static libraries inside it, and memory glibc allocated (strdup, getline, asprintf)
# would be freed into jemalloc.
#
# Dynamic (deps/jemalloc exists: scripts/jemalloc.sh, run by `make`'s setup, built it from
# Debian's source): jemalloc is a shared library of its own, libwavelet-jemalloc.so, with names
# prefixed wl__je_, dynamic TLS and the arena's options built in. It is copied next to
# libwavelet.so (and installed beside it); libwavelet.so does not link it: pinned.c loads it with
# dlopen at the arena's start (WL_PINNED_DYNAMIC). libwavelet.so's own TLS is then ~250 bytes,
# so a program may dlopen it with glibc's defaults.
#
# Static, the fallback (no deps/jemalloc): Debian's static PIC archive (libjemalloc-dev) with
# every global symbol renamed wl__je_<name> by objcopy, linked in. That archive uses initial-exec
# TLS (2.6 KiB): libwavelet.so is then marked STATIC_TLS and loads with LD_PRELOAD or as a
# DT_NEEDED dependency, while glibc refuses to dlopen it ("cannot allocate memory in static TLS
# block") unless GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384 is set for the process.
# Linking it adds --exclude-libs for the archive, so a shared library never exports its symbols.
#
# The global property WL_JEMALLOC_SO holds the copy's path in the dynamic flavour, and is empty in
# the static one (tests/ reads it).
include_guard(GLOBAL)

set(_wl_je_deps ${PROJECT_SOURCE_DIR}/deps/jemalloc)
# A change in deps/ (jemalloc built or removed: its directory's time changes) reconfigures,
# switching the flavour; created empty if absent so that there is something to watch.
file(MAKE_DIRECTORY ${PROJECT_SOURCE_DIR}/deps)
set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
             ${PROJECT_SOURCE_DIR}/deps ${CMAKE_CURRENT_LIST_FILE})
if(EXISTS ${_wl_je_deps}/lib/libwavelet-jemalloc.so AND
   EXISTS ${_wl_je_deps}/include/jemalloc/jemalloc.h)
  set(_wl_je_so ${CMAKE_BINARY_DIR}/lib/libwavelet-jemalloc.so)
  add_custom_command(OUTPUT ${_wl_je_so}
    COMMAND ${CMAKE_COMMAND} -E copy ${_wl_je_deps}/lib/libwavelet-jemalloc.so ${_wl_je_so}
    DEPENDS ${_wl_je_deps}/lib/libwavelet-jemalloc.so
    COMMENT "Copying deps/jemalloc's libwavelet-jemalloc.so beside libwavelet.so")
  add_custom_target(wl_jemalloc_so ALL DEPENDS ${_wl_je_so})
  # Its header (types and MALLOCX_* only; the functions are reached through dlsym), and the copy
  # built before whatever links this.
  add_library(wl_jemalloc_private INTERFACE)
  target_include_directories(wl_jemalloc_private INTERFACE ${_wl_je_deps}/include)
  target_compile_definitions(wl_jemalloc_private INTERFACE WL_PINNED_DYNAMIC=1)
  target_link_libraries(wl_jemalloc_private INTERFACE Threads::Threads ${CMAKE_DL_LIBS})
  add_dependencies(wl_jemalloc_private wl_jemalloc_so)
  set_property(GLOBAL PROPERTY WL_JEMALLOC_SO ${_wl_je_so})
  return()
endif()
set_property(GLOBAL PROPERTY WL_JEMALLOC_SO "")
file(REMOVE ${CMAKE_BINARY_DIR}/lib/libwavelet-jemalloc.so) # a dynamic configure's, now unused
message(STATUS "wavelet: no deps/jemalloc (scripts/jemalloc.sh builds it): the pinned arena "
               "links Debian's static jemalloc, and a dlopen of libwavelet.so then needs "
               "GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384")

find_file(WL_JEMALLOC_PIC_ARCHIVE libjemalloc_pic.a
          PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE} /usr/lib64 /usr/lib /usr/local/lib
          DOC "jemalloc's static PIC archive (Debian: libjemalloc-dev)")
find_path(WL_JEMALLOC_INCLUDE_DIR jemalloc/jemalloc.h)
if(CMAKE_NM)
  set(WL_NM ${CMAKE_NM})
else()
  find_program(WL_NM nm)
endif()
if(CMAKE_OBJCOPY)
  set(WL_OBJCOPY ${CMAKE_OBJCOPY})
else()
  find_program(WL_OBJCOPY objcopy)
endif()

if(NOT WL_JEMALLOC_PIC_ARCHIVE OR NOT WL_JEMALLOC_INCLUDE_DIR OR NOT WL_NM OR NOT WL_OBJCOPY)
  message(WARNING "wavelet: jemalloc's PIC archive, header, nm or objcopy not found "
                  "(scripts/setup.sh installs libjemalloc-dev): the pinned-host arena is not built")
  return()
endif()

set(_wl_je_dir ${CMAKE_BINARY_DIR}/jemalloc)
set(_wl_je_lib ${_wl_je_dir}/libwljemalloc.a)
set(_wl_je_syms ${_wl_je_dir}/rename.txt)
set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
             ${WL_JEMALLOC_PIC_ARCHIVE} ${CMAKE_CURRENT_LIST_FILE})
file(MAKE_DIRECTORY ${_wl_je_dir})
if(NOT EXISTS ${_wl_je_lib} OR ${WL_JEMALLOC_PIC_ARCHIVE} IS_NEWER_THAN ${_wl_je_lib} OR
   ${CMAKE_CURRENT_LIST_FILE} IS_NEWER_THAN ${_wl_je_lib})
  execute_process(COMMAND ${WL_NM} -g --defined-only ${WL_JEMALLOC_PIC_ARCHIVE}
                  OUTPUT_VARIABLE _wl_je_nm ERROR_QUIET RESULT_VARIABLE _wl_je_rc)
  if(NOT _wl_je_rc EQUAL 0)
    message(FATAL_ERROR "wavelet: nm failed on ${WL_JEMALLOC_PIC_ARCHIVE}")
  endif()
  # Every defined global C symbol; C++ operators (_Z*) are left alone: nothing pulls their
  # member in, and a renamed operator new would be no use.
  string(REGEX MATCHALL "[0-9a-f]+ [A-Za-z] [A-Za-z_][A-Za-z0-9_]*" _wl_je_lines "${_wl_je_nm}")
  set(_wl_je_map "")
  set(_wl_je_seen "")
  foreach(_l IN LISTS _wl_je_lines)
    string(REGEX REPLACE "^[0-9a-f]+ [A-Za-z] " "" _s "${_l}")
    if(_s MATCHES "^_Z" OR _s IN_LIST _wl_je_seen)
      continue()
    endif()
    list(APPEND _wl_je_seen ${_s})
    string(APPEND _wl_je_map "${_s} wl__je_${_s}\n")
  endforeach()
  # jemalloc's one dlsym call (dlsym(RTLD_NEXT, "pthread_create"), at its initialisation) would
  # reach libwavelet.so's own dlsym hook, maybe before that is ready: it goes to a stub in
  # pinned.c that answers NULL, after which jemalloc calls pthread_create directly.
  string(APPEND _wl_je_map "dlsym wl__je_dlsym\n")
  if(NOT "mallocx" IN_LIST _wl_je_seen OR NOT "mallctl" IN_LIST _wl_je_seen)
    message(FATAL_ERROR "wavelet: ${WL_JEMALLOC_PIC_ARCHIVE} defines no mallocx/mallctl")
  endif()
  file(WRITE ${_wl_je_syms} "${_wl_je_map}")
  execute_process(COMMAND ${WL_OBJCOPY} --redefine-syms=${_wl_je_syms}
                          ${WL_JEMALLOC_PIC_ARCHIVE} ${_wl_je_lib}
                  RESULT_VARIABLE _wl_je_rc ERROR_VARIABLE _wl_je_err)
  if(NOT _wl_je_rc EQUAL 0)
    message(FATAL_ERROR "wavelet: objcopy could not rename jemalloc's symbols: ${_wl_je_err}")
  endif()
  # The result must define no C library name and call no dlsym.
  execute_process(COMMAND ${WL_NM} ${_wl_je_lib} OUTPUT_VARIABLE _wl_je_nm2 ERROR_QUIET)
  if(_wl_je_nm2 MATCHES "[0-9a-f]+ [TWDBV] (malloc|free|calloc|realloc|posix_memalign)\n" OR
     _wl_je_nm2 MATCHES " U dlsym\n")
    file(REMOVE ${_wl_je_lib})
    message(FATAL_ERROR "wavelet: renaming jemalloc's symbols left malloc or dlsym in place")
  endif()
endif()

add_library(wl_jemalloc_private STATIC IMPORTED GLOBAL)
set_target_properties(wl_jemalloc_private PROPERTIES
  IMPORTED_LOCATION ${_wl_je_lib}
  INTERFACE_INCLUDE_DIRECTORIES ${WL_JEMALLOC_INCLUDE_DIR}
  INTERFACE_LINK_LIBRARIES "Threads::Threads;m;${CMAKE_DL_LIBS}"
  INTERFACE_LINK_OPTIONS "LINKER:--exclude-libs,libwljemalloc.a")
