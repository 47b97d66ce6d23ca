"""The code's shape: scripts/function_lengths.py finds each function's lines from its
signature to its closing brace, and checks the list of known long functions both ways;
the program refuses bad input with FieldError only."""

import importlib.util
import os

_SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "scripts", "function_lengths.py")
_spec = importlib.util.spec_from_file_location("function_lengths", _SCRIPT)
fl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fl)

_SOURCE = r'''// a comment with a brace {
#include <string>

namespace a::b {
namespace {

const char* kText = "}{ not code";
constexpr int kTable[] = {1, 2, 3};

int Plain(int x) {
  if (x > 0) {
    return 1;
  }
  return 0;
}

}  // namespace

struct Widget {
  Widget(int a, int b) : a_(a), b_{b} {
    auto lambda = [this](int y) {
      return y + a_;
    };
    (void)lambda;
  }
  int Get() const { return a_; }
  int a_;
  int b_;
};

template <class T>
T Twice(const T& value,
        std::span<const int> rest = {}) {
  /* } */
  return value + value;
}

std::string Raw() {
  return R"x(}})x";
}

bool Widget::operator()(char c) const noexcept {
  return c == '}' || c == '{';
}

}  // namespace a::b
'''


def test_each_function_is_counted_from_its_signature_to_its_brace(tmp_path):
    path = tmp_path / "sample.cc"
    path.write_text(_SOURCE)
    found = {name: (line, lines) for name, line, lines in fl.functions(str(path))}
    assert found == {
        "Plain": (10, 6),
        "Widget": (20, 6),        # the initializer list's b_{b} is not the body
        "Get": (26, 1),
        "Twice": (31, 6),         # from its `template <class T>` line
        "Raw": (38, 3),
        "Widget::operator()": (42, 3),
    }, found


def test_long_functions_are_checked_against_the_list():
    long = [(120, "a.cc", 1, "Big"), (101, "b.cc", 9, "Grown"), (150, "c.cc", 3, "New")]
    known = {("a.cc", "Big"): 120, ("b.cc", "Grown"): 100, ("d.cc", "Split"): 130}
    problems = fl.problems(long, known)
    assert any("c.cc: New has 150 lines" in p for p in problems)
    assert any("b.cc: Grown grew from 100 to 101" in p for p in problems)
    assert any("d.cc: Split is within the limit now" in p for p in problems)
    assert not any("a.cc" in p for p in problems)
    assert len(problems) == 3


def test_the_program_refuses_bad_input_only_with_field_errors():
    """app/ throws FieldError (rlsched::Fail) for bad input, never a bare
    std::invalid_argument that loses the field."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    app = os.path.join(root, "app", "src")
    bare = []
    for name in sorted(os.listdir(app)):
        if name.endswith((".cc", ".h")):
            with open(os.path.join(app, name), encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    if "throw std::invalid_argument" in line:
                        bare.append(f"app/src/{name}:{number}: {line.strip()}")
    assert not bare, "\n".join(bare)
