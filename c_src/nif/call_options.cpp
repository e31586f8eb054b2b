#include "call_options.hpp"

#include "atoms.hpp"
#include "exphil/device.hpp"
#include "resources.hpp"

namespace exphil::nif {

int call_device(const TensorArg& first) {
  if (const int d = known_device(first); d >= 0) return d;
  PointerInfo info;
  if (pointer_info(first.desc.data, info).ok() && info.device >= 0) return info.device;
  return 0;
}

Stream decode_stream(ErlNifEnv* env, const Options& opts) {
  auto term = opts.get("stream");
  if (!term || enif_is_identical(*term, atoms().managed)) return nullptr;
  // A special handle, not a stream object: it names the legacy stream of
  // whichever device is current, and the library enters the tensors' device
  // before it launches, records events or takes workspace on it.
  if (enif_is_identical(*term, atoms().legacy_default)) return legacy_stream();
  if (StreamResource* s = get_stream(env, *term)) return s->stream;
  bad_argument("stream", ":managed, :legacy_default or an ExPhil.Native.Stream", *term);
}

bool decode_sync(const Options& opts) {
  auto term = opts.get("sync");
  return term ? get_boolean(*term, "sync") : true;
}

}  // namespace exphil::nif
