// The Elixir.ExPhil.Native NIF library: its function table and the load,
// upgrade and unload callbacks. Loading touches no CUDA, so the module loads
// on a machine without a GPU; every entry point and callback catches
// everything, so no C++ exception or CUDA failure reaches the VM.
#include <erl_nif.h>

#include "atoms.hpp"
#include "attention_nifs.hpp"
#include "buffer_nifs.hpp"
#include "device_nifs.hpp"
#include "gated_rnn_nifs.hpp"
#include "resources.hpp"
#include "scan_nifs.hpp"
#include "selective_scan_nifs.hpp"
#include "terms.hpp"
#include "xla_ffi_nifs.hpp"

namespace exphil::nif {
namespace {

template <ScanOp Op>
ERL_NIF_TERM forward(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] { return scan_forward_nif(env, Op, argc, argv); });
}

template <ScanOp Op>
ERL_NIF_TERM backward(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] { return scan_backward_nif(env, Op, argc, argv); });
}

template <GatedRnnCell Cell>
ERL_NIF_TERM gated_rnn_forward(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  return gated_rnn_forward_nif(env, Cell, argc, argv);
}

template <GatedRnnCell Cell>
ERL_NIF_TERM gated_rnn_backward(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  return gated_rnn_backward_nif(env, Cell, argc, argv);
}

template <GatedRnnCell Cell>
ERL_NIF_TERM gated_rnn_stack_forward(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  return gated_rnn_stack_forward_nif(env, Cell, argc, argv);
}

template <GatedRnnCell Cell>
ERL_NIF_TERM gated_rnn_stack_backward(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  return gated_rnn_stack_backward_nif(env, Cell, argc, argv);
}

int on_load(ErlNifEnv* env, void**, ERL_NIF_TERM) {
  try {
    make_atoms(env);
    return open_resource_types(env, ERL_NIF_RT_CREATE) ? 0 : 1;
  } catch (...) {
    return 1;
  }
}

int on_upgrade(ErlNifEnv* env, void**, void**, ERL_NIF_TERM) {
  try {
    make_atoms(env);
    return open_resource_types(env, static_cast<ErlNifResourceFlags>(ERL_NIF_RT_CREATE | ERL_NIF_RT_TAKEOVER))
               ? 0
               : 1;
  } catch (...) {
    return 1;
  }
}

// Nothing to do: devices, streams and open IPC handles belong to the
// process and are reclaimed with it; buffers and events are freed by their
// resource destructors.
void on_unload(ErlNifEnv*, void*) {}

constexpr auto kDirty = ERL_NIF_DIRTY_JOB_IO_BOUND;

ErlNifFunc nif_functions[] = {
    {"nif_device_count", 0, device_count_nif, kDirty},
    {"nif_device_info", 1, device_info_nif, kDirty},
    {"nif_memory_held", 1, memory_held_nif, kDirty},
    {"nif_synchronize", 0, synchronize_all_nif, kDirty},
    {"nif_synchronize", 1, synchronize_nif, kDirty},
    {"nif_await", 1, await_nif, kDirty},
    {"nif_new_stream", 1, new_stream_nif, kDirty},
    {"nif_allocate", 3, allocate_nif, kDirty},
    {"nif_upload", 4, upload_nif, kDirty},
    {"nif_download", 1, download_nif, kDirty},
    {"nif_free", 1, free_nif, kDirty},
    {"nif_pointer", 1, pointer_nif, 0},
    {"nif_export_ipc", 1, export_ipc_nif, kDirty},
    {"nif_import_ipc", 4, import_ipc_nif, kDirty},
    {"nif_open_ipc_handles", 0, open_ipc_handles_nif, 0},
    {"nif_allocation_offset", 1, allocation_offset_nif, kDirty},
    {"nif_register_xla_ffi", 2, register_xla_ffi_nif, kDirty},
    {"nif_linear_scan_forward", 3, forward<ScanOp::linear_scan>, kDirty},
    {"nif_linear_scan_backward", 5, backward<ScanOp::linear_scan>, kDirty},
    {"nif_min_gru_forward", 3, forward<ScanOp::min_gru>, kDirty},
    {"nif_min_gru_backward", 5, backward<ScanOp::min_gru>, kDirty},
    {"nif_min_lstm_forward", 4, forward<ScanOp::min_lstm>, kDirty},
    {"nif_min_lstm_backward", 6, backward<ScanOp::min_lstm>, kDirty},
    {"nif_liquid_forward", 3, forward<ScanOp::liquid>, kDirty},
    {"nif_liquid_backward", 5, backward<ScanOp::liquid>, kDirty},
    {"nif_selective_scan_forward", 6, selective_scan_forward_nif, kDirty},
    {"nif_selective_scan_backward", 7, selective_scan_backward_nif, kDirty},
    {"nif_attention_forward", 4, attention_forward_nif, kDirty},
    {"nif_attention_backward", 7, attention_backward_nif, kDirty},
    {"nif_gru_forward", 3, gated_rnn_forward<GatedRnnCell::gru>, kDirty},
    {"nif_gru_backward", 5, gated_rnn_backward<GatedRnnCell::gru>, kDirty},
    {"nif_lstm_forward", 3, gated_rnn_forward<GatedRnnCell::lstm>, kDirty},
    {"nif_lstm_backward", 5, gated_rnn_backward<GatedRnnCell::lstm>, kDirty},
    {"nif_slstm_forward", 3, gated_rnn_forward<GatedRnnCell::slstm>, kDirty},
    {"nif_slstm_backward", 5, gated_rnn_backward<GatedRnnCell::slstm>, kDirty},
    {"nif_gru_stack_forward", 4, gated_rnn_stack_forward<GatedRnnCell::gru>, kDirty},
    {"nif_gru_stack_backward", 7, gated_rnn_stack_backward<GatedRnnCell::gru>, kDirty},
    {"nif_lstm_stack_forward", 4, gated_rnn_stack_forward<GatedRnnCell::lstm>, kDirty},
    {"nif_lstm_stack_backward", 7, gated_rnn_stack_backward<GatedRnnCell::lstm>, kDirty},
};

}  // namespace
}  // namespace exphil::nif

ERL_NIF_INIT(Elixir.ExPhil.Native, exphil::nif::nif_functions, exphil::nif::on_load, nullptr,
             exphil::nif::on_upgrade, exphil::nif::on_unload)
