# Compiler settings shared by every swarm target.
find_program(SWARM_CCACHE ccache)
if(SWARM_CCACHE)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${SWARM_CCACHE})
endif()

function(swarm_target_defaults target)
  target_compile_options(${target} PRIVATE -Wall -Wextra)
  if(SWARM_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=${SWARM_SANITIZE} -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=${SWARM_SANITIZE})
  endif()
endfunction()
