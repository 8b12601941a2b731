# Compiler settings shared by every swarm target.
find_program(SWARM_CCACHE ccache)
if(SWARM_CCACHE)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${SWARM_CCACHE})
endif()

# SWARM_WERROR: warnings in the project's own code fail the build (scripts/test.sh, and so CI,
# turns it on). Third-party headers come in as system headers (-isystem) and are not affected.
option(SWARM_WERROR "Treat warnings in swarm's own code as errors" OFF)

# swarm_target_defaults(target [NO_SANITIZE]): NO_SANITIZE leaves SWARM_SANITIZE off for it.
function(swarm_target_defaults target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "NO_SANITIZE" "" "")
  target_compile_options(${target} PRIVATE -Wall -Wextra)
  if(SWARM_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
  if(SWARM_SANITIZE AND NOT arg_NO_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=${SWARM_SANITIZE} -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=${SWARM_SANITIZE})
  endif()
endfunction()
