#include "common/openmp_wait.hpp"
#include "common/env.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace swarm {

void bound_openmp_spin_wait(char** argv) {
  if (argv == nullptr || argv[0] == nullptr) return;
  if (env_value("GOMP_SPINCOUNT") || env_value("OMP_WAIT_POLICY")) return;
  // Only a process with libgomp loaded (the torch build) has workers to bound.
  if (dlsym(RTLD_DEFAULT, "GOMP_parallel") == nullptr) return;
  if (setenv("GOMP_SPINCOUNT", kOpenMpSpinCount, 1) != 0) return;
  execv("/proc/self/exe", argv);
  // Not re-executed (no /proc): the variable is set but libgomp has read its default already.
  unsetenv("GOMP_SPINCOUNT");
}

const char* openmp_wait_setting() {
  static const std::string setting = [] {
    if (const auto s = env_value("GOMP_SPINCOUNT")) return "GOMP_SPINCOUNT=" + *s;
    if (const auto p = env_value("OMP_WAIT_POLICY")) return "OMP_WAIT_POLICY=" + *p;
    return std::string("libgomp default spin");
  }();
  return setting.c_str();
}

}  // namespace swarm
