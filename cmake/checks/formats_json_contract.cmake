# `kvgate formats --json` contract: one object per preset with the contract keys, and the reference
# page figures at D=128, H=8, B=16 (int8 K+V page 33,280 B, f16 65,536 B: the byte layout of
# docs/FORMATS.md, checked against the oracle in oracle/tests/oracle_selftest.cpp).
execute_process(COMMAND ${KVGATE} formats --head-dim 128 --kv-heads 8 --block-size 16 --json
                OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvgate formats --json exited with ${rc}")
endif()
string(JSON n LENGTH "${out}")
# One object per row of KVGATE_PRESETS (the one list; rows are '  X(A, name, k, v, slot, kind)').
file(STRINGS "${CMAKE_CURRENT_LIST_DIR}/../../runtime/include/kvgate/format_list.hpp" _rows
     REGEX "^  X\\(A, [a-z0-9_]+, [a-z0-9_]+, [a-z0-9_]+, [0-9]+, [a-z_]+\\)")
string(REPLACE "\\" "" _rows "${_rows}")  # the rows' line-continuation backslash would escape the list separator
list(LENGTH _rows expected)
if(expected LESS 9)
  message(FATAL_ERROR "read ${expected} rows of KVGATE_PRESETS from format_list.hpp: the row regex no longer matches")
endif()
if(NOT n EQUAL expected)
  message(FATAL_ERROR "expected ${expected} presets (the rows of KVGATE_PRESETS), got ${n}")
endif()
math(EXPR last "${n} - 1")
foreach(i RANGE ${last})
  foreach(key name k v k_bytes_per_cell v_bytes_per_cell bytes_per_cell page_bytes)
    string(JSON val ERROR_VARIABLE err GET "${out}" ${i} ${key})
    if(err)
      message(FATAL_ERROR "preset ${i} lacks key '${key}'")
    endif()
  endforeach()
  string(JSON name GET "${out}" ${i} name)
  string(JSON pb GET "${out}" ${i} page_bytes)
  if(name STREQUAL "int8" AND NOT pb EQUAL 33280)
    message(FATAL_ERROR "int8 page_bytes ${pb} != 33280")
  endif()
  if(name STREQUAL "f16" AND NOT pb EQUAL 65536)
    message(FATAL_ERROR "f16 page_bytes ${pb} != 65536")
  endif()
endforeach()
message(STATUS "formats --json contract holds for ${n} presets")
