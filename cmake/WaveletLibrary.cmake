# wl_add_library(NAME [COMMON] [ALIAS alias] [LINK lib...]): from the object library NAME_obj,
# makes the static (NAME_static, file libNAME.a) and shared (NAME) libraries, gives them the
# public include folder and LINK, installs both and names them in wavelet.pc. COMMON adds the
# private helpers' objects (common/), hidden like everything not marked WL_API.
function(wl_add_library name)
  cmake_parse_arguments(L "COMMON" "ALIAS" "LINK" ${ARGN})
  set(objs $<TARGET_OBJECTS:${name}_obj>)
  if(L_COMMON)
    list(APPEND objs $<TARGET_OBJECTS:wlcommon_obj>)
  endif()
  add_library(${name}_static STATIC ${objs})
  set_target_properties(${name}_static PROPERTIES OUTPUT_NAME ${name})
  add_library(${name} SHARED ${objs})
  set_target_properties(${name} PROPERTIES VERSION ${PROJECT_VERSION}
                                           SOVERSION ${PROJECT_VERSION_MAJOR})
  foreach(t ${name} ${name}_static)
    target_include_directories(${t} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                           $<INSTALL_INTERFACE:include>)
    target_link_libraries(${t} PUBLIC ${L_LINK})
  endforeach()
  if(L_ALIAS)
    add_library(wavelet::${L_ALIAS} ALIAS ${name})
    add_library(wavelet::${L_ALIAS}_static ALIAS ${name}_static)
  endif()
  set_property(GLOBAL APPEND PROPERTY WAVELET_INSTALL_TARGETS ${name} ${name}_static)
  set_property(GLOBAL APPEND PROPERTY WAVELET_PC_LIBS -l${name})
endfunction()
