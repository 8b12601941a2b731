# Third-party dependencies, all from Debian packages (see scripts/setup.sh).
set(THREADS_PREFER_PTHREAD_FLAG ON)
find_package(Threads REQUIRED)
find_package(Boost 1.81 REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
# The swarm exchange (SAPO): the NATS C client (Debian libnats-dev)
pkg_check_modules(NATS REQUIRED IMPORTED_TARGET libnats)
find_package(PNG REQUIRED)  # swarm-plot writes its charts with libpng
if(SWARM_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
# Boost.Asio/Beast are header-only here; keep the build lean.
add_compile_definitions(BOOST_ASIO_NO_DEPRECATED)
