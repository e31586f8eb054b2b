// Catch2 main for every test binary. A run whose spec matches no test, or a
// test case without a single assertion, fails: a test that cannot fail must
// never count as passed. With --require-gpu (how CMake registers
// GPU tests) a machine without a usable CUDA device makes the binary print
// why and exit with 77, which CTest reports as skipped: never failed, never
// passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "device_buffer.hpp"

int main(int argc, char** argv) {
  Catch::Session session;
  session.configData().warnings = static_cast<Catch::WarnAbout::What>(
      Catch::WarnAbout::NoAssertions | Catch::WarnAbout::NoTests);
  bool require_gpu = false;
  using Catch::clara::Opt;
  session.cli(session.cli() |
              Opt(require_gpu)["--require-gpu"](
                  "exit with code 77 (skipped) when no CUDA device is usable"));
  if (const int rc = session.applyCommandLine(argc, argv)) return rc;
  if (require_gpu) {
    std::string why;
    if (!exphil::test::gpu_available(&why)) {
      std::printf("SKIPPED: GPU test needs a CUDA device: %s\n", why.c_str());
      return 77;
    }
  }
  return session.run();
}
