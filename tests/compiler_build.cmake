# Configures and builds the whole project (tests included) with another compiler and -Werror, with
# AddressSanitizer and UndefinedBehaviorSanitizer when SANITIZE is on; ctest then runs its unit tests
# (which run its own memcalc program) in two halves beside the fuzzing. Called by ctest with SOURCE_DIR,
# WORK_DIR, COMPILER, SANITIZE.
file(REMOVE_RECURSE "${WORK_DIR}")
# -O0: the sanitizers catch the same faults unoptimised, and this build, the suite's longest step, compiles
# in a third of -O1's time (the tests then run a few times slower, seconds).
set(flags "-O0")
set(fuzz OFF)
if(SANITIZE)
  # The libFuzzer targets come from this same build (scripts/fuzz.sh's flags, FUZZ_PREBUILT): one clang
  # build of the program's sources instead of two, the suite's longest steps.
  set(flags "-O0 -gline-tables-only -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer")
  set(fuzz ON)
endif()
# gold links the sanitized binaries in a third of ld.bfd's time (the test program: 5 s, not 17).
set(link_flags "${flags}")
find_program(GOLD ld.gold)
if(GOLD)
  set(link_flags "${flags} -fuse-ld=gold")
endif()
foreach(args
    "-S;${SOURCE_DIR};-B;${WORK_DIR};-DCMAKE_CXX_COMPILER=${COMPILER};-DCMAKE_BUILD_TYPE=None;-DMEMCALC_WERROR=ON;-DMEMCALC_BUILD_TESTS=ON;-DMEMCALC_BUILD_BENCHMARKS=OFF;-DMEMCALC_PYTHON=OFF;-DMEMCALC_WEB=OFF;-DMEMCALC_FUZZ=${fuzz};-DCMAKE_CXX_FLAGS=${flags};-DCMAKE_EXE_LINKER_FLAGS=${link_flags}"
    "--build;${WORK_DIR};-j2")
  execute_process(COMMAND "${CMAKE_COMMAND}" ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${COMPILER} build failed: cmake ${args}\n${out}\n${err}")
  endif()
endforeach()
message(STATUS "${COMPILER}: built with -Werror ${flags}")
