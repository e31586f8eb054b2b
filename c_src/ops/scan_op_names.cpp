// Names of the scan ops and their arguments, as exphil.h spells them.
#include "exphil/scan.hpp"

namespace exphil {

namespace {

struct ScanOpInfo {
  const char* name;
  int inputs;
  const char* input_names[kMaxScanInputs];
  const char* grad_names[kMaxScanInputs];
};

const ScanOpInfo* info(ScanOp op) noexcept {
  static constexpr ScanOpInfo kInfo[] = {
      {"linear_scan", 2, {"a", "b", nullptr}, {"grad_a", "grad_b", nullptr}},
      {"min_gru", 2, {"gate", "candidate", nullptr}, {"grad_gate", "grad_candidate", nullptr}},
      {"min_lstm", 3, {"forget", "input", "candidate"},
       {"grad_forget", "grad_input", "grad_candidate"}},
      {"liquid", 2, {"tau", "target", nullptr}, {"grad_tau", "grad_target", nullptr}},
      {"min_gru_activated", 2, {"z", "candidate", nullptr}, {"grad_z", "grad_candidate", nullptr}},
      {"min_lstm_activated", 3, {"f", "i", "candidate"}, {"grad_f", "grad_i", "grad_candidate"}},
      {"diag_linear", 2, {"a", "b", nullptr}, {"grad_a", "grad_b", nullptr}},
      {"elu_gru", 2, {"gate", "candidate", nullptr}, {"grad_gate", "grad_candidate", nullptr}},
  };
  const int i = static_cast<int>(op);
  return i >= 0 && i < static_cast<int>(sizeof(kInfo) / sizeof(kInfo[0])) ? &kInfo[i] : nullptr;
}

}  // namespace

int scan_input_count(ScanOp op) noexcept {
  const ScanOpInfo* s = info(op);
  return s ? s->inputs : 0;
}

const char* scan_op_name(ScanOp op) noexcept {
  const ScanOpInfo* s = info(op);
  return s ? s->name : "unknown_scan_op";
}

const char* scan_input_name(ScanOp op, int i) noexcept {
  const ScanOpInfo* s = info(op);
  return s && i >= 0 && i < s->inputs ? s->input_names[i] : "unknown_input";
}

const char* scan_grad_input_name(ScanOp op, int i) noexcept {
  const ScanOpInfo* s = info(op);
  return s && i >= 0 && i < s->inputs ? s->grad_names[i] : "unknown_input";
}

}  // namespace exphil
