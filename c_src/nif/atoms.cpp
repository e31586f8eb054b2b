#include "atoms.hpp"

#include <vector>

namespace exphil::nif {

namespace {
Atoms g_atoms;
// [description][tensor], parallel to op_descriptions().
std::vector<std::vector<ERL_NIF_TERM>> g_key_atoms;
}

const Atoms& atoms() { return g_atoms; }

ERL_NIF_TERM atom(ErlNifEnv* env, const char* name) {
  ERL_NIF_TERM a;
  if (enif_make_existing_atom(env, name, &a, ERL_NIF_LATIN1)) return a;
  return enif_make_atom(env, name);
}

ERL_NIF_TERM key_atom(const TensorDescription& tensor) {
  const std::vector<OpDescription>& all = op_descriptions();
  for (std::size_t d = 0; d < all.size() && d < g_key_atoms.size(); ++d) {
    const std::vector<TensorDescription>& tensors = all[d].tensors;
    if (&tensor >= tensors.data() && &tensor < tensors.data() + tensors.size())
      return g_key_atoms[d][static_cast<std::size_t>(&tensor - tensors.data())];
  }
  return g_atoms.nil;  // not a description's tensor: a caller's bug, seen as :nil
}

void make_atoms(ErlNifEnv* env) {
  g_key_atoms.clear();
  for (const OpDescription& d : op_descriptions()) {
    std::vector<ERL_NIF_TERM> keys;
    for (const TensorDescription& t : d.tensors) keys.push_back(enif_make_atom(env, t.key.c_str()));
    g_key_atoms.push_back(std::move(keys));
  }
  Atoms& a = g_atoms;
  auto mk = [env](const char* n) { return enif_make_atom(env, n); };
  a.ok = mk("ok");
  a.error = mk("error");
  a.true_ = mk("true");
  a.false_ = mk("false");
  a.nil = mk("nil");
  a.no_cuda_device = mk("no_cuda_device");
  a.xla_ffi_registration = mk("xla_ffi_registration");
  a.out_of_memory = mk("out_of_memory");
  a.cuda_error = mk("cuda_error");
  a.already_freed = mk("already_freed");
  a.internal = mk("internal");
  a.struct_ = mk("__struct__");
  a.exception = mk("__exception__");
  a.message = mk("message");
  a.argument_error = mk("Elixir.ArgumentError");
  a.buffer_module = mk("Elixir.ExPhil.Native.Buffer");
  a.event_module = mk("Elixir.ExPhil.Native.Event");
  a.stream_module = mk("Elixir.ExPhil.Native.Stream");
  a.kind = mk("kind");
  a.local = mk("local");
  a.ipc = mk("ipc");
  a.address = mk("address");
  a.handle = mk("handle");
  a.data_size = mk("data_size");
  a.f = mk("f");
  a.bf = mk("bf");
  a.ref = mk("ref");
  a.type = mk("type");
  a.shape = mk("shape");
  a.device = mk("device");
  a.h0 = mk("h0");
  a.grad_h_final = mk("grad_h_final");
  a.outputs = mk("outputs");
  a.sync = mk("sync");
  a.stream = mk("stream");
  a.managed = mk("managed");
  a.legacy_default = mk("legacy_default");
  a.state_type = mk("state_type");
  a.none = mk("none");
  a.causal = mk("causal");
  a.window = mk("window");
  a.bhtd = mk("bhtd");
  a.bthd = mk("bthd");
  a.exact = mk("exact");
  a.tf32x3 = mk("tf32x3");
  a.tf32 = mk("tf32");
  a.y = mk("y");
  a.h_final = mk("h_final");
  a.grad_y = mk("grad_y");
  a.grad_h0 = mk("grad_h0");
  a.grad_x = mk("grad_x");
  a.grad_dt = mk("grad_dt");
  a.grad_a = mk("grad_a");
  a.grad_b = mk("grad_b");
  a.grad_c = mk("grad_c");
  a.grad_dt_bias = mk("grad_dt_bias");
  a.grad_d = mk("grad_d");
  a.grad_z = mk("grad_z");
  a.o = mk("o");
  a.lse = mk("lse");
  a.grad_q = mk("grad_q");
  a.grad_k = mk("grad_k");
  a.grad_v = mk("grad_v");
  a.name = mk("name");
  a.total_memory = mk("total_memory");
  a.free_memory = mk("free_memory");
  a.workspace_reserved = mk("workspace_reserved");
  a.workspace_in_use = mk("workspace_in_use");
  a.capture_blocks = mk("capture_blocks");
  a.offset = mk("offset");
  a.compute_capability = mk("compute_capability");
  a.multiprocessor_count = mk("multiprocessor_count");
}

}  // namespace exphil::nif
