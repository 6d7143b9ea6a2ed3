# The command line that `mamba2ssd fuzz --op OP` prints for a failing case reproduces that case: runs a
# short sweep with one case spoiled (--testing-perturb), takes the `mamba2ssd run|prefill|decode ...`
# line it printed and runs it. The problem must be the same one (its describe line) and, unspoiled,
# it must pass.
# Usage: cmake -DEXE=path/to/mamba2ssd -DOP=forward|backward|prefill|decode -P fuzz_repro.cmake
execute_process(COMMAND ${EXE} fuzz --impl cpu --op ${OP} --cases 4 --seed 9 --testing-perturb 2
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("$ mamba2ssd fuzz --impl cpu --op ${OP} --cases 4 --seed 9 --testing-perturb 2\n${out}${err}")
if(NOT rc STREQUAL "1")
  message(FATAL_ERROR "fuzz: exit status ${rc}, expected 1")
endif()
if(NOT out MATCHES "      problem ([^\n]+)\n      mamba2ssd ((run|prefill|decode) [^\n]+)\n")
  message(FATAL_ERROR "fuzz printed no failing case with its command line")
endif()
set(problem "${CMAKE_MATCH_1}")
set(command "${CMAKE_MATCH_2}")
separate_arguments(args UNIX_COMMAND "${command}")
execute_process(COMMAND ${EXE} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("$ mamba2ssd ${command}\n${out}${err}")
if(NOT rc STREQUAL "0")
  message(FATAL_ERROR "the printed command: exit status ${rc}, expected 0")
endif()
string(FIND "${out}" "  problem  ${problem}\n" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the printed command ran another problem than the case's: ${problem}")
endif()
