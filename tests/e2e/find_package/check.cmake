# Installs the build tree into a temporary prefix, builds the consumer project against it with
# find_package(parallax), and runs it. Invoked by CTest (test e2e_find_package):
#   cmake -DBUILD_DIR=... -DWORK_DIR=... -DGENERATOR=... -DCXX=... -P check.cmake
cmake_minimum_required(VERSION 3.20)  # IN_LIST in script mode
set(PX_E2E_TEST e2e_find_package)
include(${CMAKE_CURRENT_LIST_DIR}/forbidden.cmake)

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
run("install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
run("configure" ${CMAKE_COMMAND} -S "${CMAKE_CURRENT_LIST_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${prefix}
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DPX_EXPECT_PREFIX=${prefix})
run("build" ${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run("run" "${WORK_DIR}/build/consumer")
px_link_report("${WORK_DIR}/build" consumer report)
px_forbidden_in("${report}" found)
foreach(name cairo Cbc mpi icu parallax_pax)
  if(NOT name IN_LIST found)
    message(FATAL_ERROR "e2e_find_package: the umbrella consumer's link line does not name ${name}:\n${report}")
  endif()
endforeach()
