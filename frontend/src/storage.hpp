// Storage: an array's buffer and the engine var that orders its accesses
// (shared by the NDArray sources and the fusion of elementwise ops).
#pragma once

#include <lazydag/engine/engine.hpp>
#include <lazydag/engine/stream.hpp>

#include <atomic>
#include <cstdint>
#include <iostream>

#include "host_pool.hpp"
#include "internal.hpp"

namespace lazydag::detail {

inline std::atomic<std::int64_t> g_bytes{0};

/// Storages made on this thread so far, and the thread's number (unique in
/// the process: an address would be reused by a later thread): a storage
/// records both when it is made, so a thread can tell the buffers it made
/// after a point of its own (autograd's gradients, made_since).
inline std::atomic<std::uint64_t> g_threads_seen{0};
inline thread_local std::uint64_t t_storages_made = 0;
inline thread_local const std::uint64_t t_thread_number = g_threads_seen.fetch_add(1, std::memory_order_relaxed) + 1;

namespace fusion {
struct Group;
}

/// A buffer and the engine var that orders its accesses. Every recorded op
/// that touches the buffer holds a reference, so the buffer is freed only
/// after its last access has run; the var's deletion is then recorded.
/// Host buffers come from the host pool at once. Stream-device buffers are
/// allocated by the first op that writes them, on its stream, and given
/// back with the var once every access has completed on the device
/// (Engine::delete_owned_var_and_free), or, while a CPU node still uses
/// one, freed by a recorded op that writes the var after every access.
struct Storage {
  engine::Engine* eng;
  engine::Var var;
  Device device;
  void* data = nullptr;  // stream devices: set by the first writer, in stream order
  std::size_t bytes;
  // In-place writes recorded so far (autograd refuses a backward that would
  // read a saved array written since it was saved).
  std::atomic<std::uint64_t> version{0};
  // In-place writes recorded with a gradient (autograd.cpp's rebase): a
  // view whose autograd record is older routes gradients to the values
  // before the write, and backward refuses it.
  std::atomic<std::uint64_t> grad_generation{0};
  // The open fusion group that reads or writes this buffer and has not been
  // recorded yet (fusion.cpp), or null. Every other access records the
  // group first (settle), so the engine sees accesses in program order.
  std::atomic<fusion::Group*> group{nullptr};

  // The var is owned: deleting it through the engine is refused (it would
  // leave this storage unable to order its own free). A host buffer is
  // taken from the pool at once unless `deferred` (a fused op's result:
  // allocate() when the fused node is recorded, and only if it is needed).
  // Where and when it was made (see t_storages_made).
  std::uint64_t made_by = t_thread_number;
  std::uint64_t made_at = ++t_storages_made;

  // A deferred storage gets its var then too (ensure_var): a result the
  // fused node does not keep never touches the engine at all.
  Storage(engine::Engine& e, Device dev, std::size_t n, bool deferred = false)
      : eng(&e), device(dev), bytes(n) {
    if (deferred) return;
    var = e.new_owned_var("an NDArray");
    if (dev.is_stream_device()) return;
    try {
      allocate();
    } catch (...) {
      e.delete_owned_var(var);
      throw;
    }
  }
  /// The var of a storage constructed deferred, made on first use (under
  /// its fusion group's lock, before the group is recorded).
  void ensure_var() {
    if (!var.valid()) var = eng->new_owned_var("an NDArray");
  }
  /// A host buffer for a storage constructed deferred.
  void allocate() {
    data = HostPool::get().allocate(bytes);  // 64-byte aligned, pooled by size class
    g_bytes.fetch_add(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
  }
  ~Storage() {
    // A stream-device buffer no op ever wrote (a fused result nobody kept)
    // was never allocated: nothing to free. The last reference is dropped
    // after every op that held one has run, so `data` is final here.
    if (device.is_stream_device() && data != nullptr) {
      // Given back with the var once its accesses have completed: no node.
      try {
        if (eng->delete_owned_var_and_free(var, device, data, bytes)) return;
      } catch (const std::exception& e) {  // a destructor never throws; the node below is the fallback
        std::cerr << "lazydag: could not give back a " << device.str() << " buffer with its var: " << e.what()
                  << '\n';
      }
      // A CPU node of the caller's own (through NDArray::var()) still reads
      // or writes it: the free is recorded after it.
      void* p = data;
      const std::size_t n = bytes;
      try {
        engine::PushOptions o;
        o.device = device;
        o.name = "free";
        eng->push([p, n](const engine::RunContext& ctx) { ctx.stream_device->deallocate(p, n, ctx.stream); },
                  {}, {var}, o);
      } catch (const std::exception& e) {
        std::cerr << "lazydag: could not record the free of a " << device.str() << " buffer: " << e.what()
                  << '\n';
      }
    } else if (!device.is_stream_device() && data != nullptr) {
      HostPool::get().release(data, bytes);
      g_bytes.fetch_sub(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
    }
    if (!var.valid()) return;  // a fused result nobody kept: no var was made
    try {
      eng->delete_owned_var(var);
    } catch (const std::exception& e) {  // a destructor never throws
      std::cerr << "lazydag: could not record the deletion of an array's var: " << e.what() << '\n';
    }
  }
  /// Inside an op on the storage's device: the buffer, allocated now on the
  /// op's stream if this is its first write.
  void* ensure(const engine::RunContext& ctx) {
    if (data == nullptr && ctx.stream_device != nullptr) data = ctx.stream_device->allocate(bytes, ctx.stream);
    return data;
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

}  // namespace lazydag::detail
