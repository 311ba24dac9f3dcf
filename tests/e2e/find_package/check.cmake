# Installs the build tree into a temporary prefix, builds the consumer project against it with
# find_package(parallax), and runs it. Invoked by CTest (test e2e_find_package):
#   cmake -DBUILD_DIR=... -DWORK_DIR=... -DGENERATOR=... -DCXX=... -P check.cmake
cmake_minimum_required(VERSION 3.20)  # IN_LIST in script mode
set(PX_E2E_TEST e2e_find_package)
include(${CMAKE_CURRENT_LIST_DIR}/forbidden.cmake)

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
run("install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
# What the build put in (PX_LINKED: names the umbrella consumer must link) and left out
# (PX_UNLINKED: names it must not link; PX_UNFINDABLE: packages its configure must not need), as
# comma lists from CMakeLists.txt (PX_WITH_*). Without them: the full build.
if(NOT DEFINED PX_LINKED)
  set(PX_LINKED "cairo,Cbc,mpi,icu,parallax_pax")
endif()
foreach(var PX_LINKED PX_UNLINKED PX_UNFINDABLE)
  string(REPLACE "," ";" ${var} "${${var}}")
endforeach()
set(disabled)
foreach(pkg ${PX_UNFINDABLE})
  list(APPEND disabled -DCMAKE_DISABLE_FIND_PACKAGE_${pkg}=ON)
endforeach()
run("configure" ${CMAKE_COMMAND} -S "${CMAKE_CURRENT_LIST_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${prefix}
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DPX_EXPECT_PREFIX=${prefix} --no-warn-unused-cli ${disabled})
run("build" ${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run("run" "${WORK_DIR}/build/consumer")
px_link_report("${WORK_DIR}/build" consumer report)
set(PX_FORBIDDEN_NAMES ${PX_FORBIDDEN_NAMES} ${PX_LINKED} ${PX_UNLINKED})
px_forbidden_in("${report}" found)
foreach(name ${PX_LINKED})
  if(NOT name IN_LIST found)
    message(FATAL_ERROR "e2e_find_package: the umbrella consumer's link line does not name ${name}:\n${report}")
  endif()
endforeach()
foreach(name ${PX_UNLINKED})
  if(name IN_LIST found)
    message(FATAL_ERROR "e2e_find_package: the umbrella consumer links ${name}, which this build left out:\n${report}")
  endif()
endforeach()
# A component that was not built: find_package(parallax COMPONENTS pax) fails, naming the option.
if("parallax_pax" IN_LIST PX_UNLINKED)
  execute_process(COMMAND ${CMAKE_COMMAND} -S "${CMAKE_CURRENT_LIST_DIR}" -B "${WORK_DIR}/build-pax" -G "${GENERATOR}"
                  -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
                  -DPX_ASK_COMPONENTS=pax --no-warn-unused-cli ${disabled}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc EQUAL 0 OR NOT out MATCHES "PX_WITH_PAX=ON")
    message(FATAL_ERROR "e2e_find_package: asking for the component pax, which was not built, did not fail naming PX_WITH_PAX (${rc}):\n${out}")
  endif()
  message(STATUS "e2e_find_package: find_package(parallax COMPONENTS pax) reports pax missing")
endif()
