// A ScanRunner over the C++ API, optionally on a caller's stream and with
// forced launch options; records the layouts the library chose.
#pragma once

#include <memory>

#include "exphil/scan.hpp"
#include "scan_harness.hpp"

namespace exphil::test {

struct ChosenLayouts {
  ScanLaunchInfo forward, backward;
};

// stream == nullptr: the managed stream, waited on with exphil::synchronize.
ScanRunner cpp_runner(Stream stream = nullptr, ScanLaunchOptions options = {},
                      std::shared_ptr<ChosenLayouts> chosen = nullptr);

}  // namespace exphil::test
