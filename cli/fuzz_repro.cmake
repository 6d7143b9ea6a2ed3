# The command line that `mamba2ssd fuzz` prints for a failing case reproduces that case: runs a short
# sweep with one case spoiled (--testing-perturb), takes the `mamba2ssd run ...` line it printed and
# runs it. The problem must be the same one (its describe line) and, unspoiled, it must pass.
# Usage: cmake -DEXE=path/to/mamba2ssd -P fuzz_repro.cmake
execute_process(COMMAND ${EXE} fuzz --impl cpu --cases 4 --seed 9 --testing-perturb 2
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("$ mamba2ssd fuzz --impl cpu --cases 4 --seed 9 --testing-perturb 2\n${out}${err}")
if(NOT rc STREQUAL "1")
  message(FATAL_ERROR "fuzz: exit status ${rc}, expected 1")
endif()
if(NOT out MATCHES "      problem ([^\n]+)\n      mamba2ssd run ([^\n]+)\n")
  message(FATAL_ERROR "fuzz printed no failing case with its command line")
endif()
set(problem "${CMAKE_MATCH_1}")
separate_arguments(args UNIX_COMMAND "run ${CMAKE_MATCH_2}")
execute_process(COMMAND ${EXE} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("$ mamba2ssd ${CMAKE_MATCH_2}\n${out}${err}")
if(NOT rc STREQUAL "0")
  message(FATAL_ERROR "the printed command: exit status ${rc}, expected 0")
endif()
string(FIND "${out}" "  problem  ${problem}\n" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the printed command ran another problem than the case's: ${problem}")
endif()
