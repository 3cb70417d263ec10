// dtcore._C: the module, and the order in which each area adds its bindings.
//
// Built with torch's bundled pybind11 (see CMakeLists.txt) so that at::Tensor, c10d::Store and
// c10d::Backend objects cross between torch._C and this module as the same Python types.
#include "bindings/bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "dtcore's C++ core: bootstrap, rendezvous, communicators, reducer, checker, checkpoint files, logging";
  using namespace dtcore::bindings;
  bind_common(m);  // first: the error classes every other area raises
  bind_bootstrap(m);
  bind_comm(m);
  bind_reducer(m);
  bind_check(m);
  bind_activation(m);
  bind_checkpoint(m);
}
