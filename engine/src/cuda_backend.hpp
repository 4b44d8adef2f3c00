// The CUDA stream device's factory: engine/cuda/device.cu in a CUDA build,
// engine/cuda/stub.cpp (which fails loudly) otherwise.
#pragma once

#include <lazydag/engine/stream.hpp>

#include <memory>

namespace lazydag::engine::detail {

/// gpu(id) with `compute_streams` non-blocking compute streams and two copy
/// streams. Throws BackendUnavailable saying why when it cannot be used
/// (a build without CUDA, no driver, no such device).
std::unique_ptr<StreamDevice> make_cuda_device(int id, int compute_streams);

/// NVTX ranges around every node's function (CPU nodes, sim ops, CUDA
/// launches), named after the node, for Nsight timelines; no-ops in a build
/// without CUDA. Near free when no tool is attached.
void range_push(const char* name) noexcept;
void range_pop() noexcept;

}  // namespace lazydag::engine::detail
