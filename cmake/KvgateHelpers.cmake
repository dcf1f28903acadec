# One helper per kind of target. Sources are listed explicitly at each call site.

# kvgate_add_library(NAME <name> ALIAS <ns::alias> SOURCES ... [PUBLIC_INCLUDE dir] [PUBLIC_LINK ...] [PRIVATE_LINK ...])
function(kvgate_add_library)
  cmake_parse_arguments(A "" "NAME;ALIAS" "SOURCES;PUBLIC_INCLUDE;PUBLIC_LINK;PRIVATE_LINK" ${ARGN})
  add_library(${A_NAME} STATIC ${A_SOURCES})
  add_library(${A_ALIAS} ALIAS ${A_NAME})
  if(A_PUBLIC_INCLUDE)
    target_include_directories(${A_NAME} PUBLIC ${A_PUBLIC_INCLUDE})
  endif()
  target_link_libraries(${A_NAME} PUBLIC ${A_PUBLIC_LINK} PRIVATE ${A_PRIVATE_LINK} kvgate_warnings)
endfunction()

# kvgate_add_gate(NAME <gate_family_exe> SOURCES ... LINK ... [LABELS ...])
# A gate executable is a Catch2 program; ctest runs it whole and `kvgate gate` runs it with a
# machine-readable reporter.
function(kvgate_add_gate)
  cmake_parse_arguments(A "" "NAME;TIMEOUT" "SOURCES;LINK;LABELS" ${ARGN})
  add_executable(${A_NAME} ${A_SOURCES})
  target_link_libraries(${A_NAME} PRIVATE kvgate::catch_main ${A_LINK} kvgate_warnings)
  set_target_properties(${A_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/gates)
  add_test(NAME ${A_NAME} COMMAND ${A_NAME})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 600)
  endif()
  set_tests_properties(${A_NAME} PROPERTIES LABELS "gate;${A_LABELS}" TIMEOUT ${A_TIMEOUT}
    ENVIRONMENT "KVGATE_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  set_property(GLOBAL APPEND PROPERTY KVGATE_GATE_TARGETS ${A_NAME})
endfunction()

# kvgate_add_test(NAME <exe> SOURCES ... LINK ...): plain Catch2 unit tests (not gates).
function(kvgate_add_test)
  cmake_parse_arguments(A "" "NAME" "SOURCES;LINK;LABELS" ${ARGN})
  add_executable(${A_NAME} ${A_SOURCES})
  target_link_libraries(${A_NAME} PRIVATE kvgate::catch_main ${A_LINK} kvgate_warnings)
  add_test(NAME ${A_NAME} COMMAND ${A_NAME})
  set_tests_properties(${A_NAME} PROPERTIES LABELS "unit;${A_LABELS}"
    ENVIRONMENT "KVGATE_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endfunction()

# kvgate_add_bench(NAME <exe> SOURCES ... LINK ...): Google Benchmark programs.
function(kvgate_add_bench)
  cmake_parse_arguments(A "" "NAME" "SOURCES;LINK" ${ARGN})
  add_executable(${A_NAME} ${A_SOURCES})
  target_link_libraries(${A_NAME} PRIVATE benchmark::benchmark ${A_LINK} kvgate_warnings)
  set_target_properties(${A_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
endfunction()

# Walks the link closure of TARGET and stops configure if FORBIDDEN appears in it.
function(_kvgate_link_closure target out)
  set(seen "")
  set(todo ${target})
  while(todo)
    list(POP_FRONT todo t)
    if(NOT TARGET ${t})
      continue()
    endif()
    get_target_property(real ${t} ALIASED_TARGET)
    if(real)
      set(t ${real})
    endif()
    if(t IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${t})
    get_target_property(libs ${t} LINK_LIBRARIES)
    get_target_property(ilibs ${t} INTERFACE_LINK_LIBRARIES)
    foreach(l IN LISTS libs ilibs)
      if(l AND NOT l MATCHES "-NOTFOUND$")
        string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" l "${l}")
        list(APPEND todo ${l})
      endif()
    endforeach()
  endwhile()
  set(${out} ${seen} PARENT_SCOPE)
endfunction()

function(kvgate_assert_not_linked target forbidden)
  _kvgate_link_closure(${target} closure)
  if(forbidden IN_LIST closure)
    message(FATAL_ERROR "kvgate: target '${target}' links '${forbidden}' (link closure: ${closure}). "
      "oracle/ and runtime/ must stay independent (docs/ARCHITECTURE.md): remove that link.")
  endif()
endfunction()

add_library(kvgate_warnings INTERFACE)
target_compile_options(kvgate_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>
  # GCC 12 at -O3 reports std::string concatenation as overlapping memcpy (a known false positive).
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wno-restrict>)
