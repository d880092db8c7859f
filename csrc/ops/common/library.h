// CUSTOMOPS_LIBRARY_IMPL(key, m): TORCH_LIBRARY_IMPL(customops, key, m) for this library.
//
// Only the first copy of the op library loaded in a process registers anything. A second
// copy (another path or another build) would make TORCH_LIBRARY throw from a static
// initializer, which aborts the process; here it prints one line naming both files and
// registers nothing, and Python's `import customops` turns that into an ImportError.
#pragma once

#include <torch/library.h>

#include <memory>

namespace customops {

// Whether this copy defined the customops namespace (decided on first call, from any
// translation unit's static initializer).
bool owns_namespace();

class LibraryInit {
 public:
  LibraryInit(void (*init)(torch::Library&), c10::DispatchKey key, const char* file, uint32_t line);

 private:
  std::unique_ptr<torch::Library> library_;
};

}  // namespace customops

#define CUSTOMOPS_LIBRARY_IMPL(k, m) CUSTOMOPS_LIBRARY_IMPL_UID(k, m, C10_UID)
#define CUSTOMOPS_LIBRARY_IMPL_UID(k, m, uid)                                                         \
  static void C10_CONCATENATE(customops_library_impl_##k##_, uid)(torch::Library&);                   \
  static const ::customops::LibraryInit C10_CONCATENATE(customops_library_init_##k##_, uid)(          \
      &C10_CONCATENATE(customops_library_impl_##k##_, uid), c10::DispatchKey::k, __FILE__, __LINE__); \
  void C10_CONCATENATE(customops_library_impl_##k##_, uid)(torch::Library & m)
