# What a consumer of parallax::core must not link (the dependencies of the other components), and
# how the find_package tests read what a consumer links: its link command (build.ninja or, for
# Makefiles, link.txt) and, where ldd exists, the shared libraries the built binary loads.
set(PX_FORBIDDEN_NAMES cairo Cbc CoinUtils mpi icu pcre2 sentencepiece zstd
    parallax_io parallax_nn parallax_parallel parallax_pax)

# The consumer's link command(s) plus `ldd` of the binary, as one text.
function(px_link_report build_dir exe out)
  set(text "")
  if(EXISTS "${build_dir}/build.ninja")
    file(STRINGS "${build_dir}/build.ninja" lines REGEX "^  LINK_(LIBRARIES|PATH|FLAGS) = ")
    string(JOIN "\n" text ${lines})
  else()
    file(GLOB links "${build_dir}/CMakeFiles/${exe}.dir/link.txt")
    foreach(l ${links})
      file(READ "${l}" t)
      string(APPEND text "${t}")
    endforeach()
  endif()
  if(text STREQUAL "")
    message(FATAL_ERROR "px_link_report: no link command found under ${build_dir}")
  endif()
  find_program(LDD ldd)
  if(LDD)
    execute_process(COMMAND ${LDD} "${build_dir}/${exe}" OUTPUT_VARIABLE ldd_out RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "px_link_report: ldd ${build_dir}/${exe} failed (${rc})")
    endif()
    string(APPEND text "\n${ldd_out}")
  endif()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

# The forbidden names that `text` links (lib<name> or -l<name>, case-insensitive), as a list.
function(px_forbidden_in text out)
  string(TOLOWER "${text}" lower)
  set(found)
  foreach(name ${PX_FORBIDDEN_NAMES})
    string(TOLOWER "${name}" n)
    if(lower MATCHES "(lib|-l)${n}")
      list(APPEND found ${name})
    endif()
  endforeach()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

# Shared by both check.cmake scripts: the -D variables they need, and run(what COMMAND...), which
# fails the test named by PX_E2E_TEST when the command fails.
foreach(var BUILD_DIR WORK_DIR GENERATOR CXX)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check.cmake: pass -D${var}=...")
  endif()
endforeach()
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${PX_E2E_TEST}: ${what} failed (${rc})")
  endif()
endfunction()
