// The two kinds of error metapipe reports (docs/architecture.md, "Errors"): a user_error says what in
// the program or input is wrong and how to fix it; an internal_error means metapipe itself is wrong.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace mp {

struct user_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct internal_error : std::logic_error {
  using std::logic_error::logic_error;
};
// "not supported yet: ..." is a user_error too: the request is valid but metapipe cannot do it yet.
struct not_supported : user_error {
  explicit not_supported(const std::string& what) : user_error("not supported yet: " + what) {}
};

namespace detail {
template <class... Ts> std::string concat(const Ts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
}  // namespace detail

// Throw a user_error built from the streamed parts: MP_USER_CHECK(k % 16 == 0, "K=", k, " must be ...").
template <class... Ts> [[noreturn]] void fail_user(const Ts&... parts) {
  throw user_error(detail::concat(parts...));
}
template <class... Ts> [[noreturn]] void fail_internal(const Ts&... parts) {
  throw internal_error(detail::concat(parts...));
}

}  // namespace mp

#define MP_USER_CHECK(cond, ...)                                                                    \
  do {                                                                                             \
    if (!(cond)) ::mp::fail_user(__VA_ARGS__);                                                     \
  } while (0)
#define MP_INTERNAL_CHECK(cond, ...)                                                                \
  do {                                                                                             \
    if (!(cond)) ::mp::fail_internal(__FILE__, ":", __LINE__, ": internal error: ", __VA_ARGS__);  \
  } while (0)
