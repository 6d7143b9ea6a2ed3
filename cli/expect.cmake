# Runs EXE with ARGS and fails unless it exits with RC and its stdout + stderr match REGEX.
# Usage: cmake -DEXE=... -DARGS=a|b -DRC=0 -DREGEX=... -P expect.cmake   (ARGS separated by |)
string(REPLACE "|" ";" ARGS "${ARGS}")
execute_process(COMMAND ${EXE} ${ARGS}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(REPLACE ";" " " shown "${ARGS}")
message("$ mamba2ssd ${shown}\n${out}${err}")
if(NOT rc STREQUAL "${RC}")
  message(FATAL_ERROR "exit status ${rc}, expected ${RC}")
endif()
if(NOT "${out}${err}" MATCHES "${REGEX}")
  message(FATAL_ERROR "output does not match: ${REGEX}")
endif()
