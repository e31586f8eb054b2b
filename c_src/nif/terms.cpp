#include "terms.hpp"

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "atoms.hpp"
#include "exphil/device.hpp"

namespace exphil::nif {

std::string show(ERL_NIF_TERM term, std::size_t limit) {
  std::vector<char> buf(limit + 4);
  const int n = enif_snprintf(buf.data(), buf.size(), "%T", term);
  if (n < 0) return "<unprintable term>";
  std::string s(buf.data());
  if (static_cast<std::size_t>(n) >= buf.size() - 1) s += "...";
  return s;
}

std::string type_text(DType dtype) {
  switch (dtype) {
    case DType::f16: return "{:f, 16}";
    case DType::bf16: return "{:bf, 16}";
    case DType::f32: break;
  }
  return "{:f, 32}";
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "{";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "}";
}

void bad_argument(const std::string& argument, const std::string& expected, ERL_NIF_TERM got) {
  throw ArgumentError(argument, expected, got);
}

ERL_NIF_TERM make_error(ErlNifEnv* env, ERL_NIF_TERM reason) {
  return enif_make_tuple2(env, atoms().error, reason);
}

ERL_NIF_TERM make_ok(ErlNifEnv* env, ERL_NIF_TERM value) {
  return enif_make_tuple2(env, atoms().ok, value);
}

ERL_NIF_TERM make_string(ErlNifEnv* env, const std::string& s) {
  ERL_NIF_TERM term;
  unsigned char* data = enif_make_new_binary(env, s.size(), &term);
  if (data && !s.empty()) std::memcpy(data, s.data(), s.size());
  return term;
}

ERL_NIF_TERM make_map(ErlNifEnv* env, std::initializer_list<std::pair<ERL_NIF_TERM, ERL_NIF_TERM>> entries) {
  std::vector<ERL_NIF_TERM> keys, values;
  for (const auto& [k, v] : entries) {
    keys.push_back(k);
    values.push_back(v);
  }
  return make_map(env, std::move(keys), std::move(values));
}

// By value: erl_nif takes the arrays as non-const.
ERL_NIF_TERM make_map(ErlNifEnv* env, std::vector<ERL_NIF_TERM> keys, std::vector<ERL_NIF_TERM> values) {
  ERL_NIF_TERM map;
  if (!enif_make_map_from_arrays(env, keys.data(), values.data(), static_cast<unsigned>(keys.size()), &map))
    throw std::bad_alloc();
  return map;
}

ERL_NIF_TERM raise_argument_error(ErlNifEnv* env, const ArgumentError& e) {
  if (e.got)
    return enif_raise_exception(
        env, enif_make_tuple4(env, atom(env, "exphil_bad_argument"), make_string(env, e.argument),
                              make_string(env, e.expected), e.got));
  const std::string& message = e.message;
  const Atoms& a = atoms();
  ERL_NIF_TERM keys[] = {a.struct_, a.exception, a.message};
  ERL_NIF_TERM values[] = {a.argument_error, a.true_, make_string(env, message)};
  ERL_NIF_TERM exception;
  // Not make_map: this runs inside the exception handler and must not throw.
  if (!enif_make_map_from_arrays(env, keys, values, 3, &exception)) return enif_make_badarg(env);
  return enif_raise_exception(env, exception);
}

ERL_NIF_TERM internal_error(ErlNifEnv* env, const char* what) {
  return make_error(env, enif_make_tuple2(env, atoms().internal, make_string(env, what ? what : "")));
}

ERL_NIF_TERM status_result(ErlNifEnv* env, const Status& status) {
  const Atoms& a = atoms();
  switch (status.code()) {
    case StatusCode::ok: return a.ok;
    case StatusCode::invalid_argument:
    case StatusCode::not_supported: return raise_argument_error(env, ArgumentError(status.message()));
    case StatusCode::no_device: return make_error(env, a.no_cuda_device);
    case StatusCode::out_of_memory: return make_error(env, a.out_of_memory);
    case StatusCode::cuda_error: {
      return make_error(env, enif_make_tuple3(env, a.cuda_error, atom(env, cuda_error_name(status.cuda_error())),
                                              make_string(env, status.message())));
    }
    case StatusCode::internal: break;
  }
  return internal_error(env, status.message().c_str());
}

int64_t get_integer(ErlNifEnv* env, ERL_NIF_TERM term, const std::string& argument, int64_t min,
                    int64_t max) {
  ErlNifSInt64 v = 0;
  if (!enif_get_int64(env, term, &v) || v < min || v > max)
    bad_argument(argument, "an integer in " + std::to_string(min) + ".." + std::to_string(max), term);
  return v;
}

bool get_boolean(ERL_NIF_TERM term, const std::string& argument) {
  if (enif_is_identical(term, atoms().true_)) return true;
  if (enif_is_identical(term, atoms().false_)) return false;
  bad_argument(argument, "true or false", term);
}

bool get_f32_range(ErlNifEnv* env, ERL_NIF_TERM term, double& out) {
  ErlNifSInt64 integer = 0;
  if (enif_get_int64(env, term, &integer))
    out = static_cast<double>(integer);
  else if (!enif_get_double(env, term, &out))
    return false;
  return std::fabs(out) <= static_cast<double>(FLT_MAX);
}

DType get_type(ErlNifEnv* env, ERL_NIF_TERM term, const std::string& argument) {
  const ERL_NIF_TERM* items = nullptr;
  int arity = 0;
  int bits = 0;
  if (enif_get_tuple(env, term, &arity, &items) && arity == 2 && enif_get_int(env, items[1], &bits)) {
    if (enif_is_identical(items[0], atoms().f) && bits == 32) return DType::f32;
    if (enif_is_identical(items[0], atoms().f) && bits == 16) return DType::f16;
    if (enif_is_identical(items[0], atoms().bf) && bits == 16) return DType::bf16;
  }
  bad_argument(argument, "type {:f, 32}, {:f, 16} or {:bf, 16}", term);
}

ERL_NIF_TERM make_type(ErlNifEnv* env, DType dtype) {
  switch (dtype) {
    case DType::f16: return enif_make_tuple2(env, atoms().f, enif_make_int(env, 16));
    case DType::bf16: return enif_make_tuple2(env, atoms().bf, enif_make_int(env, 16));
    case DType::f32: break;
  }
  return enif_make_tuple2(env, atoms().f, enif_make_int(env, 32));
}

std::vector<int64_t> get_shape(ErlNifEnv* env, ERL_NIF_TERM term, const std::string& argument) {
  const ERL_NIF_TERM* items = nullptr;
  int arity = 0;
  if (!enif_get_tuple(env, term, &arity, &items) || arity > EXPHIL_MAX_RANK)
    bad_argument(argument, "a shape tuple of at most " + std::to_string(EXPHIL_MAX_RANK) + " dimensions", term);
  std::vector<int64_t> dims(static_cast<std::size_t>(arity));
  for (int i = 0; i < arity; ++i) {
    ErlNifSInt64 d = 0;
    if (!enif_get_int64(env, items[i], &d) || d < 0)
      bad_argument(argument, "a shape tuple of non-negative integers", term);
    dims[static_cast<std::size_t>(i)] = d;
  }
  return dims;
}

ERL_NIF_TERM make_shape(ErlNifEnv* env, const std::vector<int64_t>& shape) {
  std::vector<ERL_NIF_TERM> items;
  for (int64_t d : shape) items.push_back(enif_make_int64(env, d));
  return enif_make_tuple_from_array(env, items.data(), static_cast<unsigned>(items.size()));
}

std::optional<ERL_NIF_TERM> map_get(ErlNifEnv* env, ERL_NIF_TERM map, ERL_NIF_TERM key) {
  ERL_NIF_TERM value;
  if (enif_is_map(env, map) && enif_get_map_value(env, map, key, &value)) return value;
  return std::nullopt;
}

Options::Options(ErlNifEnv* env, ERL_NIF_TERM term, std::vector<const char*> accepted, const char* argument,
                 const char* kind) {
  // The accepted names as the message lists them, built only for a refusal.
  auto listed = [&] {
    std::string names;
    for (const char* n : accepted) names += (names.empty() ? ":" : ", :") + std::string(n);
    return names;
  };
  values_.reserve(accepted.size());
  auto add = [&](ERL_NIF_TERM key, ERL_NIF_TERM value) {
    char name[64];
    if (enif_get_atom(env, key, name, sizeof name, ERL_NIF_LATIN1) > 0) {
      for (const char* a : accepted) {
        if (std::strcmp(a, name) == 0) {
          for (const auto& kv : values_)
            if (kv.first == name) return;  // keyword lists: the first value wins
          values_.emplace_back(name, value);
          return;
        }
      }
    }
    bad_argument(argument, std::string(kind) + " names among " + listed(), key);
  };
  if (enif_is_map(env, term)) {
    ErlNifMapIterator it;
    if (!enif_map_iterator_create(env, term, &it, ERL_NIF_MAP_ITERATOR_FIRST))
      bad_argument(argument, "a keyword list or a map", term);
    ERL_NIF_TERM key, value;
    try {
      while (enif_map_iterator_get_pair(env, &it, &key, &value)) {
        add(key, value);
        enif_map_iterator_next(env, &it);
      }
    } catch (...) {
      enif_map_iterator_destroy(env, &it);
      throw;
    }
    enif_map_iterator_destroy(env, &it);
    return;
  }
  ERL_NIF_TERM list = term, head;
  while (enif_get_list_cell(env, list, &head, &list)) {
    const ERL_NIF_TERM* pair = nullptr;
    int arity = 0;
    if (!enif_get_tuple(env, head, &arity, &pair) || arity != 2)
      bad_argument(argument, "a keyword list or a map", term);
    add(pair[0], pair[1]);
  }
  if (!enif_is_empty_list(env, list)) bad_argument(argument, "a keyword list or a map", term);
}

std::optional<ERL_NIF_TERM> Options::get(const char* name) const {
  for (const auto& kv : values_)
    if (kv.first == name) return kv.second;
  return std::nullopt;
}

}  // namespace exphil::nif
