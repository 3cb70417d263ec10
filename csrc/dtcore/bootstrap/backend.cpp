#include "dtcore/bootstrap/backend.h"

namespace dtcore {

bool built_with_nccl() {
#if defined(DTCORE_WITH_NCCL)
  return true;
#else
  return false;
#endif
}

std::optional<std::string> choose_backend(const Sourced<std::string>& requested, const BackendFacts& facts,
                                          std::vector<Problem>* problems) {
  const std::string& want = requested.value;
  if (want == "gloo") return want;
  if (want == "auto") return facts.cuda_devices > 0 && built_with_nccl() ? "nccl" : "gloo";
  std::string message, fix;
  const std::string shown = as_written(requested.source, want);
  if (want != "nccl") {
    message = detail::cat(shown, " is not a backend.");
    fix = "use one of auto, nccl, gloo.";
  } else if (facts.cuda_devices <= 0) {
    message = detail::cat(
        shown, ", but torch sees no usable CUDA device here (torch ", facts.torch_version,
        ", CUDA_VISIBLE_DEVICES=", facts.cuda_visible_devices.empty() ? "<unset>" : facts.cuda_visible_devices, ")",
        built_with_nccl() ? "." : ", and this dtcore was built without NCCL.");
    fix = "run on a GPU node with a CUDA build of torch, or use backend='gloo'.";
  } else if (!built_with_nccl()) {
    message = detail::cat(shown, ", but this dtcore was built without NCCL.");
    fix =
        "rebuild where the CUDA toolkit and NCCL are found (set NCCL_HOME; `pip install --no-build-isolation .`), "
        "or use backend='gloo'.";
  } else {
    return want;
  }
  Problem p{"backend", requested.source, want, std::move(message), std::move(fix)};
  if (problems == nullptr) throw ConfigError(p.to_string());
  problems->push_back(std::move(p));
  return std::nullopt;
}

}  // namespace dtcore
