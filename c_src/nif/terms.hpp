// Reading and making Erlang terms, and the boundary every NIF entry point
// goes through. Bad arguments become ArgumentError exceptions in Elixir,
// with a message naming the argument, the expected and the received value;
// runtime failures become {:error, reason}.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>
#include <optional>
#include <string>
#include <vector>

#include <erl_nif.h>

#include "exphil/status.hpp"
#include "exphil/tensor.hpp"

namespace exphil::nif {

// Thrown by decoders inside the NIF; turned into an exception at the entry
// point. Never crosses the C boundary. With a received term, the NIF raises
// {:exphil_bad_argument, argument, expected, got} and ExPhil.Native turns it
// into an ArgumentError that shows `got` in Elixir syntax; otherwise it
// raises the ArgumentError with `message` directly.
struct ArgumentError {
  explicit ArgumentError(std::string full_message) : message(std::move(full_message)) {}
  ArgumentError(std::string argument_name, std::string expectation, ERL_NIF_TERM received)
      : argument(std::move(argument_name)), expected(std::move(expectation)), got(received) {}

  std::string message;
  std::string argument, expected;
  ERL_NIF_TERM got = 0;
};

// Thrown inside the NIF for a failed library or CUDA call; the entry point
// turns it into the result status_result gives.
struct Failure {
  Status status;
};

// Throws Failure unless ok.
inline void check(Status status) {
  if (!status.ok()) throw Failure{std::move(status)};
}

// At most `limit` characters of the term as Erlang prints it (for messages
// that quote a term inside a longer sentence).
std::string show(ERL_NIF_TERM term, std::size_t limit = 160);

// Elixir spellings for messages: "{:f, 32}", "{2, 32, 256}".
std::string type_text(DType dtype);
std::string shape_text(const std::vector<int64_t>& shape);

[[noreturn]] void bad_argument(const std::string& argument, const std::string& expected,
                               ERL_NIF_TERM got);

ERL_NIF_TERM make_error(ErlNifEnv* env, ERL_NIF_TERM reason);
ERL_NIF_TERM make_ok(ErlNifEnv* env, ERL_NIF_TERM value);
ERL_NIF_TERM make_string(ErlNifEnv* env, const std::string& s);  // an Elixir string (binary)
// A map of atom keys (or any keys) to values; throws std::bad_alloc if the VM cannot make it.
ERL_NIF_TERM make_map(ErlNifEnv* env, std::initializer_list<std::pair<ERL_NIF_TERM, ERL_NIF_TERM>> entries);
// The same from keys[i] => values[i] (as many of each).
ERL_NIF_TERM make_map(ErlNifEnv* env, std::vector<ERL_NIF_TERM> keys, std::vector<ERL_NIF_TERM> values);

// A failed library status as a NIF result: invalid_argument and
// not_supported raise ArgumentError; no_device, out_of_memory, cuda_error
// and internal return {:error, :no_cuda_device | :out_of_memory |
// {:cuda_error, name, message} | {:internal, message}}.
ERL_NIF_TERM status_result(ErlNifEnv* env, const Status& status);

int64_t get_integer(ErlNifEnv* env, ERL_NIF_TERM term, const std::string& argument, int64_t min,
                    int64_t max);
bool get_boolean(ERL_NIF_TERM term, const std::string& argument);

// An atom standing for one value of an enum option.
template <class Enum>
struct Choice {
  ERL_NIF_TERM atom;
  Enum value;
};

// The value whose atom `term` is; else bad_argument(argument, expected).
template <class Enum>
Enum decode_choice(ERL_NIF_TERM term, const char* argument, const char* expected,
                   std::initializer_list<Choice<Enum>> choices) {
  for (const Choice<Enum>& choice : choices)
    if (enif_is_identical(term, choice.atom)) return choice.value;
  bad_argument(argument, expected, term);
}
// An integer or float as a double that converts to a finite f32; false
// otherwise (bignums too: erl_nif cannot convert them). For callers that
// refuse the value in their own words: a float beyond f32's range would
// reach the library as an infinity, reported without the value written.
bool get_f32_range(ErlNifEnv* env, ERL_NIF_TERM term, double& out);

// Nx types {:f, 32}, {:f, 16}, {:bf, 16}.
DType get_type(ErlNifEnv* env, ERL_NIF_TERM term, const std::string& argument);
ERL_NIF_TERM make_type(ErlNifEnv* env, DType dtype);
// A shape tuple of non-negative integers, at most EXPHIL_MAX_RANK long.
std::vector<int64_t> get_shape(ErlNifEnv* env, ERL_NIF_TERM term, const std::string& argument);
ERL_NIF_TERM make_shape(ErlNifEnv* env, const std::vector<int64_t>& shape);

// Options given as a keyword list or a map with atom keys, checked against
// the names the function accepts.
class Options {
 public:
  // `argument` and `kind` name the term and its keys in messages:
  // "argument 'outputs': expected output names among :y, :h_final, ...".
  Options(ErlNifEnv* env, ERL_NIF_TERM term, std::vector<const char*> accepted, const char* argument = "opts",
          const char* kind = "option");
  std::optional<ERL_NIF_TERM> get(const char* name) const;

 private:
  std::vector<std::pair<std::string, ERL_NIF_TERM>> values_;
};

// map[key] if term is a map holding key.
std::optional<ERL_NIF_TERM> map_get(ErlNifEnv* env, ERL_NIF_TERM map, ERL_NIF_TERM key);

// The boundary of every NIF: runs body() -> ERL_NIF_TERM and turns anything
// it throws into an exception or error term. Never lets a C++ exception out.
ERL_NIF_TERM raise_argument_error(ErlNifEnv* env, const ArgumentError& e);
ERL_NIF_TERM internal_error(ErlNifEnv* env, const char* what);

template <class F>
ERL_NIF_TERM nif_entry(ErlNifEnv* env, F&& body) noexcept {
  try {
    return body();
  } catch (const ArgumentError& e) {
    return raise_argument_error(env, e);
  } catch (const Failure& f) {
    return status_result(env, f.status);
  } catch (const std::bad_alloc&) {
    return internal_error(env, "out of host memory");
  } catch (const std::exception& e) {
    return internal_error(env, e.what());
  } catch (...) {
    return internal_error(env, "unknown C++ exception");
  }
}

}  // namespace exphil::nif
