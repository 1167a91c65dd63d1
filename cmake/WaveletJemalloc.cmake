# wl_jemalloc_private: Debian's static PIC jemalloc with every global symbol renamed wl__je_<name>,
# for the pinned-host arena (interpose/src/pinned.c).
#
# Why renamed: Debian builds jemalloc without a symbol prefix, so its archive defines malloc, free,
# calloc... Linked as is into libwavelet.so, every malloc call of the library (and of the static
# libraries inside it) would bind to jemalloc's, and memory that glibc allocated (strdup,
# getline, asprintf) would be freed into jemalloc. Renamed, only calls spelled wl__je_* reach it.
# Why not dlopen("libjemalloc.so.2", RTLD_LOCAL): the shared library uses initial-exec TLS
# (DF_STATIC_TLS, 2.6 KiB), and glibc refuses to dlopen it ("cannot allocate memory in static TLS
# block"). The archive has the same TLS model, so a library linking this target must be loaded
# at process start (LD_PRELOAD or DT_NEEDED), which is how libwavelet.so is used.
# Linking it adds --exclude-libs for the archive, so a shared library never exports its symbols.
include_guard(GLOBAL)

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
