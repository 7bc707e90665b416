// core/error.h: the two kinds of failure. Sits under every module.
//
// UserError: bad input (model, config, flags, data). Carries where (file, node, YAML line) and
// what to do; the CLI prints it as one line and exits 2.
// PT_CHECK: a broken invariant, our bug. Aborts with file:line.
#pragma once

#include <stdexcept>
#include <string>

namespace pt {

class UserError : public std::runtime_error {
 public:
  // where: "model.onnx: node 'mm1' (MatMul, opset 17)"; what: the problem; todo: the fix.
  UserError(const std::string& where, const std::string& what, const std::string& todo = "")
      : std::runtime_error(compose(where, what, todo)) {}

 private:
  static std::string compose(const std::string& where, const std::string& what,
                             const std::string& todo) {
    std::string s = where.empty() ? what : where + ": " + what;
    if (!todo.empty()) s += "; " + todo;
    for (char& c : s)
      if (c == '\n' || c == '\r') c = ' ';
    return s;
  }
};

// Runs f; a UserError from it is raised again with `where` in front: for a callee that cannot
// know where its input came from (a config key and its line, a flag).
template <class F>
auto located(const std::string& where, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const UserError& e) {
    throw UserError(where, e.what());
  }
}

[[noreturn]] void internal_failure(const char* file, int line, const char* cond,
                                   const std::string& message);

}  // namespace pt

#define PT_CHECK(cond, ...)                                                        \
  do {                                                                             \
    if (!(cond)) ::pt::internal_failure(__FILE__, __LINE__, #cond, std::string{__VA_ARGS__}); \
  } while (0)
