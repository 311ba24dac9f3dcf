# cmake -DMODULE=<extension .so> -DOUT=<json> -P system_libs.cmake
# Writes the shared libraries MODULE links directly (its NEEDED entries) with the Debian package
# that installs each, as [{"soname": ..., "package": ...}], leaving out glibc's own (package libc6).
# The package is the owner of the file the dynamic loader resolves (ldd); null where dpkg-query
# does not know it (not a Debian system).
execute_process(COMMAND readelf -d ${MODULE} OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "readelf -d ${MODULE} failed (binutils)")
endif()
execute_process(COMMAND ldd ${MODULE} OUTPUT_VARIABLE resolved ERROR_QUIET)
string(REGEX MATCHALL "\\(NEEDED\\)[^\n]*\\[[^]]+\\]" needed "${dynamic}")
set(entries)
foreach(line ${needed})
  string(REGEX REPLACE ".*\\[([^]]+)\\]" "\\1" soname "${line}")
  set(package null)
  string(REPLACE "+" "\\+" pattern "${soname}")
  if(resolved MATCHES "${pattern} => ([^ \n]+)")
    set(path "${CMAKE_MATCH_1}")
    # A merged /usr: the loader's /lib/... may be dpkg's /usr/lib/... (or the other way round).
    string(REGEX REPLACE "^/usr/" "/" unmerged "${path}")
    foreach(candidate "${path}" "/usr${unmerged}" "${unmerged}")
      execute_process(COMMAND dpkg-query -S "${candidate}" OUTPUT_VARIABLE owners ERROR_QUIET RESULT_VARIABLE rc)
      if(rc EQUAL 0 AND owners MATCHES "^([^:,]+)")
        set(package "\"${CMAKE_MATCH_1}\"")
        break()
      endif()
    endforeach()
  endif()
  if(NOT package STREQUAL "\"libc6\"" AND NOT soname MATCHES "^ld-linux")  # glibc, the loader itself
    list(APPEND entries "{\"soname\": \"${soname}\", \"package\": ${package}}")
  endif()
endforeach()
list(JOIN entries ",\n " body)
file(WRITE ${OUT} "[${body}]\n")
