# cpack -G DEB of the build folder: the package's name, version, architecture and Depends, its files,
# and its program run from the package's files extracted into a scratch root (dpkg -i needs a real
# root). Called by ctest with BUILD_DIR, WORK_DIR and VERSION.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
include("${CMAKE_CURRENT_LIST_DIR}/script_step.cmake")

step(dpkg --print-architecture)
string(STRIP "${out}" arch)
step(cpack -G DEB --config "${BUILD_DIR}/CPackConfig.cmake" -B "${WORK_DIR}")
set(deb "${WORK_DIR}/memcalc_${VERSION}_${arch}.deb")
if(NOT EXISTS "${deb}")
  file(GLOB made "${WORK_DIR}/*.deb")
  message(FATAL_ERROR "no ${deb}; cpack made: ${made}")
endif()

step(dpkg-deb -I "${deb}")
foreach(field "Package: memcalc" "Version: ${VERSION}" "Architecture: ${arch}")
  if(NOT out MATCHES "${field}")
    message(FATAL_ERROR "dpkg-deb -I has no '${field}':\n${out}")
  endif()
endforeach()
# Depends: what dpkg-shlibdeps finds the program needs: nothing for a static program, libc6 where
# it is linked to the C library.
step(readelf -d "${BUILD_DIR}/memcalc")
set(dynamic "${out}")
step(dpkg-deb -f "${deb}" Depends)
string(STRIP "${out}" depends)
if(dynamic MATCHES "NEEDED.*libc\\.so" AND NOT depends MATCHES "libc6")
  message(FATAL_ERROR "the program needs libc, the package depends on '${depends}'")
elseif(NOT dynamic MATCHES "NEEDED" AND NOT depends STREQUAL "")
  message(FATAL_ERROR "the program is static, the package depends on '${depends}'")
endif()

step(dpkg-deb -c "${deb}")
foreach(file usr/bin/memcalc usr/share/man/man1/memcalc.1 usr/share/bash-completion/completions/memcalc
             usr/share/zsh/site-functions/_memcalc usr/share/memcalc/presets/llama-7b.json
             usr/include/memcalc/memcalc.hpp usr/lib/cmake/memcalc/memcalcConfig.cmake)
  string(REPLACE "." "\\." pattern "${file}")
  if(NOT out MATCHES " \\./${pattern}\n")
    message(FATAL_ERROR "the package has no ${file}:\n${out}")
  endif()
endforeach()

step(dpkg-deb -x "${deb}" "${WORK_DIR}/root")
execute_process(COMMAND "${WORK_DIR}/root/usr/bin/memcalc" --preset llama-7b --seq 4096 --recompute full
                        --format csv
                WORKING_DIRECTORY "${WORK_DIR}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES ",110698217472,backward 1,")
  message(FATAL_ERROR "the packaged memcalc printed '${out}' '${err}' (${rc})")
endif()
message(STATUS "${deb}: its files, its Depends ('${depends}') and its program check")
