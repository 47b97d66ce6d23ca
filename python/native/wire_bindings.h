// The part of rlsched._native that speaks rlsched.v1 (wire_bindings.cc): the decision
// core (class Orchestrator) and a whole Request solved in process (solve), through the
// rlsched::wire converters. Built when the wire library is (RLSCHED_BUILD_PROGRAM); the
// module then has the attribute HAS_WIRE = True.

#ifndef RLSCHED_PYTHON_NATIVE_WIRE_BINDINGS_H_
#define RLSCHED_PYTHON_NATIVE_WIRE_BINDINGS_H_

#include <pybind11/pybind11.h>

namespace rlsched::python {

// Adds Orchestrator and solve() to the module.
void RegisterWire(pybind11::module_& module);

}  // namespace rlsched::python

#endif  // RLSCHED_PYTHON_NATIVE_WIRE_BINDINGS_H_
