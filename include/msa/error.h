// The one exception type of msa. Every public entry point validates its arguments before it
// launches anything (sparse_attention_layer checks the arguments that link its steps first, then each
// step its own before its launch) and throws msa::Error with a message that names the entry point, the
// argument, what was expected and what was passed. Python maps kind() to ValueError / TypeError /
// NotImplementedError / RuntimeError.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace msa {

enum class ErrorKind {
  kValue,           // a value, shape, stride or length is wrong            -> Python ValueError
  kType,            // a dtype or device kind is wrong                       -> Python TypeError
  kNotImplemented,  // valid input this build or device cannot run          -> Python NotImplementedError
  kRuntime,         // CUDA or system failure                               -> Python RuntimeError
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// Throws msa::Error(kind, "<pieces...>") when cond is false. Pieces are streamed, so numbers and
// strings mix freely: MSA_CHECK(x > 0, kValue, "msa.attention: argument 'x': expected > 0, got ", x).
#define MSA_CHECK(cond, kind, ...)                                                  \
  do {                                                                              \
    if (!(cond)) throw ::msa::Error(::msa::ErrorKind::kind, ::msa::detail::concat(__VA_ARGS__)); \
  } while (0)

#define MSA_FAIL(kind, ...) throw ::msa::Error(::msa::ErrorKind::kind, ::msa::detail::concat(__VA_ARGS__))

}  // namespace msa
