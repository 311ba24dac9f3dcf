# Installs the build tree into a temporary prefix, builds a consumer of parallax::core only and an
# out-of-tree backend (examples/custom_backend.cc) against it and runs them, then fails if the consumer's link line or the built binary names a dependency
# that core does not need. Invoked by CTest (test e2e_find_package_core):
#   cmake -DBUILD_DIR=... -DWORK_DIR=... -DGENERATOR=... -DCXX=... -P check.cmake
cmake_minimum_required(VERSION 3.20)  # IN_LIST in script mode
set(PX_E2E_TEST e2e_find_package_core)
include(${CMAKE_CURRENT_LIST_DIR}/../find_package/forbidden.cmake)

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
run("install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
# The packages that only other components need are made unfindable: were the core component's
# config to look for one of them, the configure would fail.
set(disabled)
foreach(pkg MPI ZLIB fmt PkgConfig CLI11 nlohmann_json)
  list(APPEND disabled -DCMAKE_DISABLE_FIND_PACKAGE_${pkg}=ON)
endforeach()
run("configure" ${CMAKE_COMMAND} -S "${CMAKE_CURRENT_LIST_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${prefix}
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DPX_EXPECT_PREFIX=${prefix} --no-warn-unused-cli ${disabled})
run("build" ${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run("run" "${WORK_DIR}/build/core_consumer")
run("run the out-of-tree backend" "${WORK_DIR}/build/custom_backend")
px_link_report("${WORK_DIR}/build" core_consumer report)
px_forbidden_in("${report}" found)
if(found)
  message(FATAL_ERROR "e2e_find_package_core: a consumer of parallax::core links ${found}:\n${report}")
endif()
message(STATUS "e2e_find_package_core: the consumer links none of ${PX_FORBIDDEN_NAMES}")
