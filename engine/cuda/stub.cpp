// The CUDA device in a build without CUDA: every use fails loudly.
#include "../src/cuda_backend.hpp"

#include <string>

namespace lazydag::engine::detail {

std::unique_ptr<StreamDevice> make_cuda_device(int id, int) {
  throw BackendUnavailable("gpu(" + std::to_string(id) +
                           "): this lazydag was built without CUDA (configure with -Dcuda=enabled "
                           "where nvcc is installed)");
}

void range_push(const char*) noexcept {}
void range_pop() noexcept {}

}  // namespace lazydag::engine::detail
