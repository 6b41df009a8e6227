# Installs the build tree into a scratch prefix, builds tests/consumer against it with find_package,
# runs it, and runs the installed program from another folder (with a preset, and with an installed
# preset's JSON as a model file); checks the man page and the completions are installed. Called by ctest with SOURCE_DIR, BUILD_DIR and WORK_DIR.
file(REMOVE_RECURSE "${WORK_DIR}")
include("${CMAKE_CURRENT_LIST_DIR}/../script_step.cmake")

step("${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix")
step("${CMAKE_COMMAND}" -S "${SOURCE_DIR}/tests/consumer" -B "${WORK_DIR}/build" "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix")
step("${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
step("${WORK_DIR}/build/consumer")
if(NOT out STREQUAL "backward 32 116095778816\n")
  message(FATAL_ERROR "the consumer printed '${out}'")
endif()
step("${WORK_DIR}/prefix/bin/memcalc" --preset llama-7b --seq 4096 --recompute full --format csv)
if(NOT out MATCHES ",110698217472,backward 1,")
  message(FATAL_ERROR "the installed memcalc printed '${out}'")
endif()
set(prefix "${WORK_DIR}/prefix")
file(MAKE_DIRECTORY "${WORK_DIR}/elsewhere")
execute_process(COMMAND "${prefix}/bin/memcalc" --preset llama-7b --seq 4096 --recompute selective --format csv
                WORKING_DIRECTORY "${WORK_DIR}/elsewhere" RESULT_VARIABLE rc OUTPUT_VARIABLE out)
if(NOT rc EQUAL 0 OR NOT out MATCHES ",116095778816,backward 32,")
  message(FATAL_ERROR "the installed memcalc, run from another folder, printed '${out}' (${rc})")
endif()
step("${prefix}/bin/memcalc" --model-file "${prefix}/share/memcalc/presets/llama-7b.json" --seq 4096
     --recompute selective --format csv)
if(NOT out MATCHES ",116095778816,backward 32,")
  message(FATAL_ERROR "the installed llama-7b.json as --model-file printed '${out}'")
endif()
foreach(file share/man/man1/memcalc.1 share/bash-completion/completions/memcalc
             share/zsh/site-functions/_memcalc)
  if(NOT EXISTS "${prefix}/${file}")
    message(FATAL_ERROR "the install has no ${file}")
  endif()
endforeach()
find_program(MAN man)
if(MAN)  # the installed page renders, and is the program's
  execute_process(COMMAND "${MAN}" -l "${prefix}/share/man/man1/memcalc.1" RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "--recompute" OR NOT out MATCHES "EXIT STATUS")
    message(FATAL_ERROR "man -l of the installed page: ${rc}\n${out}\n${err}")
  endif()
endif()
message(STATUS "installed package and program work")
