// Stream devices on the emulated `sim` device: stream choice, launch edges
// and event waits, completion reported to CPU consumers, overlap across
// devices, the run-ahead bound, errors, device memory, and gpu(n) where no
// CUDA device can be used.
#include <doctest/doctest.h>

#include <lazydag/engine/engine.hpp>
#include <lazydag/engine/stream.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../../engine/src/block_cache.hpp"
#include "support.hpp"

using namespace lazydag;
using namespace lazydag::engine;

namespace {

constexpr Device kSim0{DeviceKind::kSim, 0};
constexpr Device kSim1{DeviceKind::kSim, 1};

EngineOptions threaded(Policy p = Policy::kEager, int threads = 2) {
  return test::Config{p, threads}.options();
}

PushOptions on(Device d, StreamKind k = StreamKind::kCompute, std::size_t bytes = 0,
               std::string_view name = {}) {
  PushOptions o;
  o.device = d;
  o.stream = k;
  o.bytes = bytes;
  o.name = name;
  return o;
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

TEST_SUITE("engine") {
  TEST_CASE("Streams.DependentNodesShareAStreamIndependentOnesSpread" * doctest::timeout(60)) {
    Engine eng(threaded(Policy::kLazy));
    Var a = eng.new_var();
    Var b = eng.new_var();
    std::vector<int> stream_of(4, -1);
    auto note = [&](int i) {
      return [&stream_of, i](const RunContext& ctx) {
        CHECK(ctx.device == kSim0);
        CHECK(ctx.stream != nullptr);
        CHECK(ctx.stream_device != nullptr);
        stream_of[static_cast<std::size_t>(i)] = ctx.stream_index;
      };
    };
    eng.push(note(0), {}, {a}, on(kSim0));
    eng.push(note(1), {}, {b}, on(kSim0));
    eng.push(note(2), {a}, {a}, on(kSim0));  // follows its producer
    eng.push(note(3), {}, {b}, on(kSim0, StreamKind::kCopyIn));
    eng.waitall();
    StreamDevice& dev = eng.stream_device(kSim0);
    CHECK(dev.num_compute_streams() >= 2);
    CHECK(stream_of[0] != stream_of[1]);
    CHECK(stream_of[2] == stream_of[0]);
    CHECK(stream_of[3] == dev.copy_in_stream());
  }

  // A node that overwrites data whose last users have finished (a buffer's
  // free, an in-place update after a wait) goes to the stream where the
  // data was last used, not round-robin to a stream that would wake for
  // it; readers of finished data still spread.
  TEST_CASE("Streams.AnOverwriteFollowsTheDataEvenWhenItsUsersAreDone" * doctest::timeout(60)) {
    for (const Policy p : {Policy::kEager, Policy::kLazy}) {
      CAPTURE(static_cast<int>(p));
      Engine eng(threaded(p));
      Var a = eng.new_var();
      Var r0 = eng.new_var();
      Var r1 = eng.new_var();
      std::vector<int> stream_of(6, -1);
      auto note = [&](int i) {
        return [&stream_of, i](const RunContext& ctx) { stream_of[static_cast<std::size_t>(i)] = ctx.stream_index; };
      };
      eng.push(note(0), {}, {a}, on(kSim0));
      eng.wait_to_read(a);
      eng.push(note(1), {}, {a}, on(kSim0));  // write after a finished write
      eng.wait_to_read(a);
      eng.push(note(2), {a}, {r0}, on(kSim0));  // two readers of finished data
      eng.push(note(3), {a}, {r1}, on(kSim0));
      eng.waitall();
      eng.push(note(4), {}, {a}, on(kSim0));  // write after finished reads
      eng.waitall();
      eng.push(note(5), {}, {a}, on(kSim0, StreamKind::kCopyIn));  // a copy keeps its stream
      eng.waitall();
      const StreamDevice& dev = eng.stream_device(kSim0);
      REQUIRE(dev.num_compute_streams() >= 2);
      CHECK(stream_of[1] == stream_of[0]);
      CHECK(stream_of[2] != stream_of[3]);
      CHECK(stream_of[4] == stream_of[3]);  // the newest of the finished readers
      CHECK(stream_of[5] == dev.copy_in_stream());
    }
  }

  TEST_CASE("Streams.ConsumerIsLaunchedBeforeItsProducerCompletes" * doctest::timeout(60)) {
    // The producer parks on sim(0); its consumers on sim(0) and sim(1) are
    // launched (enqueued behind an event wait) without waiting on the host,
    // and still see the producer's value when they run. A CPU consumer is
    // not started until the producer completes.
    Engine eng(threaded());
    test::Gate gate;
    Var x = eng.new_var();
    Var y = eng.new_var();
    Var z = eng.new_var();
    Var c = eng.new_var();
    std::atomic<int> value{0};
    int seen_y = -1;
    int seen_z = -1;
    int seen_c = -1;
    eng.push([&](const RunContext&) {
      CHECK(gate.wait());
      value.store(42, std::memory_order_relaxed);
    }, {}, {x}, on(kSim0));
    eng.push([&](const RunContext&) { seen_y = value.load(std::memory_order_relaxed); }, {x}, {y},
             on(kSim0));
    eng.push([&](const RunContext&) { seen_z = value.load(std::memory_order_relaxed); }, {x}, {z},
             on(kSim1));
    eng.push([&](const RunContext&) { seen_c = value.load(std::memory_order_relaxed); }, {x}, {c});
    CHECK(test::spin_until([&] { return eng.stats().nodes_launched >= 3; }));
    CHECK(eng.stats().nodes_run == 0);  // nothing has run: the host did not wait
    gate.open();
    eng.waitall();
    CHECK(seen_y == 42);
    CHECK(seen_z == 42);
    CHECK(seen_c == 42);
    CHECK(eng.stats().nodes_launched == 3);
  }

  TEST_CASE("Streams.OpsOnTwoDevicesOverlapAndABarrierSerialisesThem" * doctest::timeout(60)) {
    for (Policy p : {Policy::kLazy, Policy::kEager}) {
      CAPTURE(to_string(p));
      Engine eng(threaded(p));
      struct Interval {
        std::atomic<std::int64_t> begin{0};
        std::atomic<std::int64_t> end{0};
      };
      Interval i0;
      Interval i1;
      // Each op runs until the other has started (bounded): overlap is then
      // the only way both finish early; serialised, each gives up.
      auto op = [&](Interval& self, Interval& other) {
        return [&self, &other](const RunContext&) {
          self.begin.store(now_ns());
          (void)test::spin_until([&] { return other.begin.load() != 0; }, 2.0);
          self.end.store(now_ns());
        };
      };
      Var a = eng.new_var();
      Var b = eng.new_var();
      eng.push(op(i0, i1), {}, {a}, on(kSim0, StreamKind::kCompute, 0, "long0"));
      eng.push(op(i1, i0), {}, {b}, on(kSim1, StreamKind::kCompute, 0, "long1"));
      eng.waitall();
      CHECK(i0.begin.load() < i1.end.load());
      CHECK(i1.begin.load() < i0.end.load());

      Interval j0;
      Interval j1;
      auto timed = [](Interval& self) {
        return [&self](const RunContext&) {
          self.begin.store(now_ns());
          self.end.store(now_ns());
        };
      };
      eng.push(timed(j0), {}, {a}, on(kSim0));
      eng.waitall();  // the barrier
      eng.push(timed(j1), {}, {b}, on(kSim1));
      eng.waitall();
      CHECK(j0.end.load() <= j1.begin.load());
    }
  }

  TEST_CASE("Streams.RunAheadIsBoundedPerDevice" * doctest::timeout(60)) {
    EngineOptions o = threaded();
    o.max_in_flight = 2;
    Engine eng(o);
    test::Gate gate;
    std::atomic<int> done{0};
    std::atomic<int> max_in_flight{0};
    constexpr int kOps = 12;
    std::vector<Var> vars;
    for (int i = 0; i < kOps; ++i) vars.push_back(eng.new_var());
    for (int i = 0; i < kOps; ++i) {
      eng.push([&](const RunContext&) {
        CHECK(gate.wait());
        const int in_flight =
            static_cast<int>(eng.stats().nodes_launched) - done.load(std::memory_order_acquire);
        int m = max_in_flight.load();
        while (in_flight > m && !max_in_flight.compare_exchange_weak(m, in_flight)) {
        }
        done.fetch_add(1, std::memory_order_release);
      }, {}, {vars[static_cast<std::size_t>(i)]}, on(kSim0, StreamKind::kCompute, 1000));
    }
    CHECK(test::spin_until([&] { return eng.stats().nodes_launched == 2; }));
    CHECK(test::spin_until([&] { return eng.stats().in_flight_stalls >= 1; }));
    CHECK(eng.stats().nodes_launched == 2);
    gate.open();
    eng.waitall();
    CHECK(done.load() == kOps);
    CHECK(max_in_flight.load() <= 2);
    CHECK(eng.stats().nodes_launched == kOps);

    // A byte bound: one node at a time, however many are ready.
    EngineOptions ob = threaded();
    ob.max_in_flight_bytes = 1500;
    Engine eb(ob);
    test::Gate gate2;
    std::atomic<int> running{0};
    std::atomic<int> overlap{0};
    for (int i = 0; i < 6; ++i) {
      Var v = eb.new_var();
      eb.push([&](const RunContext&) {
        if (running.fetch_add(1) != 0) overlap.fetch_add(1);
        CHECK(gate2.wait());
        running.fetch_sub(1);
      }, {}, {v}, on(kSim0, StreamKind::kCompute, 1000));
    }
    // A stall can be counted before the held node's predecessor in the
    // bound has finished launching: wait for both.
    CHECK(test::spin_until([&] { return eb.stats().nodes_launched == 1 && eb.stats().in_flight_stalls >= 1; }));
    CHECK(eb.stats().nodes_launched == 1);
    gate2.open();
    eb.waitall();
    CHECK(overlap.load() == 0);
    CHECK(eb.stats().nodes_launched == 6);
  }

  TEST_CASE("Streams.ErrorsPoisonAcrossStreamsAndDevices" * doctest::timeout(60)) {
    for (const auto& cfg : test::all_configs()) {
      CAPTURE(cfg.str());
      Engine eng(cfg.options());
      Var a = eng.new_var();
      Var b = eng.new_var();
      Var c = eng.new_var();
      bool ran_b = false;
      bool ran_c = false;
      eng.push([](const RunContext&) { throw std::runtime_error("device fault"); }, {}, {a},
               on(kSim0, StreamKind::kCompute, 0, "bad"));
      eng.push([&](const RunContext&) { ran_b = true; }, {a}, {b}, on(kSim1));
      eng.push([&](const RunContext&) { ran_c = true; }, {b}, {c});
      try {
        eng.wait_to_read(c);
        FAIL("no error");
      } catch (const OpError& e) {
        CHECK(e.op_name() == "bad");
      }
      CHECK_FALSE(ran_b);
      CHECK_FALSE(ran_c);
      try {
        eng.waitall();
      } catch (const OpError&) {
      }
      // the device is usable afterwards
      int v = 0;
      eng.push([&](const RunContext&) { v = 7; }, {}, {a}, on(kSim0));
      eng.wait_to_read(a);
      CHECK(v == 7);
    }
  }

  TEST_CASE("Streams.DeviceMemoryIsCountedAndFreedInStreamOrder" * doctest::timeout(60)) {
    Engine eng(threaded());
    StreamDevice& dev = eng.stream_device(kSim1);
    const std::size_t before = dev.bytes_in_use();
    Var v = eng.new_var();
    void* p = nullptr;
    eng.push([&](const RunContext& ctx) {
      p = ctx.stream_device->allocate(4096, ctx.stream);
      static_cast<unsigned char*>(p)[4095] = 1;
    }, {}, {v}, on(kSim1));
    eng.wait_to_read(v);
    CHECK(dev.bytes_in_use() == before + 4096);
    eng.push([&](const RunContext& ctx) { ctx.stream_device->deallocate(p, 4096, ctx.stream); }, {},
             {v}, on(kSim1, StreamKind::kCompute, 0, "free"));
    eng.waitall();
    CHECK(dev.bytes_in_use() == before);
    // The freed block is kept by the device's pool, as a GPU's stream-ordered
    // pool keeps it: the next allocation of that size gets it back.
    // (A small allocation first: a general-purpose allocator would carve it
    // out of the freed block.)
    void* small = nullptr;
    void* again = nullptr;
    eng.push([&](const RunContext& ctx) {
      small = ctx.stream_device->allocate(100, ctx.stream);
      again = ctx.stream_device->allocate(4093, ctx.stream);
    }, {}, {v}, on(kSim1));
    eng.wait_to_read(v);
    if (lazydag::engine::detail::BlockCache::kDefaultLimit != 0) {  // not under AddressSanitizer
      CHECK(again == p);
      CHECK(small != p);
    }
    CHECK(dev.bytes_in_use() == before + 4193);
    eng.push([&](const RunContext& ctx) {
      ctx.stream_device->deallocate(again, 4093, ctx.stream);
      ctx.stream_device->deallocate(small, 100, ctx.stream);
    }, {}, {v}, on(kSim1, StreamKind::kCompute, 0, "free"));
    eng.waitall();
    CHECK(dev.bytes_in_use() == before);
  }

  TEST_CASE("Streams.AnOwnedBufferIsFreedWithItsVarOnceItsAccessesComplete" * doctest::timeout(60)) {
    struct Config {
      Policy policy;
      std::size_t max_in_flight;  // 1: the second reader waits in the run-ahead bound, holding the var
    };
    for (Config cfg : {Config{Policy::kEager, 1024}, Config{Policy::kLazy, 1024}, Config{Policy::kEager, 1}}) {
      const std::string policy_name(to_string(cfg.policy));
      CAPTURE(policy_name);
      CAPTURE(cfg.max_in_flight);
      EngineOptions options = threaded(cfg.policy);
      options.max_in_flight = cfg.max_in_flight;
      Engine eng(options);
      StreamDevice& dev = eng.stream_device(kSim1);
      const std::size_t before = dev.bytes_in_use();
      auto make = [&](Var v) {
        void* p = nullptr;
        eng.push([&p](const RunContext& ctx) {
          p = ctx.stream_device->allocate(4096, ctx.stream);
          std::memset(p, 7, 4096);
        }, {}, {v}, on(kSim1));
        eng.waitall();  // every completion has dropped its holds
        REQUIRE(p != nullptr);
        return p;
      };
      auto gate = [] {
        auto g = std::make_shared<std::promise<void>>();
        return std::make_pair(g, g->get_future().share());
      };

      // Two pending readers on two streams, each held by a gate of its own,
      // both reading the buffer: it goes back only after the second
      // completes, and no node is recorded for it.
      Var v = eng.new_owned_var("a test buffer");
      void* p = make(v);
      Var first_done = eng.new_var();
      auto [open_first, first] = gate();
      auto [open_second, second] = gate();
      std::atomic<int> read_sum{0};
      auto read = [p, &read_sum](std::shared_future<void> g) {
        return [p, &read_sum, g](const RunContext&) {
          g.wait();
          const auto* b = static_cast<const unsigned char*>(p);
          read_sum.fetch_add(b[0] + b[4095]);
        };
      };
      eng.push(read(first), {v}, {first_done}, on(kSim1));
      eng.push(read(second), {v}, {}, on(kSim1, StreamKind::kCopyOut));
      const auto recorded = eng.stats().nodes_recorded;
      CHECK(eng.delete_owned_var_and_free(v, kSim1, p, 4096));
      CHECK(eng.stats().nodes_recorded == recorded);
      CHECK(dev.bytes_in_use() == before + 4096);  // still in use by the held nodes
      CHECK_THROWS_AS(eng.push([](const RunContext&) {}, {v}, {}, on(kSim1)), InvalidArgument);
      CHECK_THROWS_AS((void)eng.delete_owned_var_and_free(v, kSim1, p, 4096), InvalidArgument);
      open_first->set_value();
      eng.wait_to_read(first_done);
      CHECK(dev.bytes_in_use() == before + 4096);  // the second reader still holds it
      open_second->set_value();
      eng.waitall();  // returns after the completion that gave it back
      CHECK(read_sum.load() == 4 * 7);
      CHECK(dev.bytes_in_use() == before);

      // A pending writer: the same.
      Var w = eng.new_owned_var("a test buffer");
      void* q = make(w);
      auto [open_writer, writer] = gate();
      eng.push([q, writer](const RunContext&) {
        writer.wait();
        static_cast<unsigned char*>(q)[0] = 1;
      }, {}, {w}, on(kSim1));
      CHECK(eng.delete_owned_var_and_free(w, kSim1, q, 4096));
      CHECK(dev.bytes_in_use() == before + 4096);
      open_writer->set_value();
      eng.waitall();
      CHECK(dev.bytes_in_use() == before);

      // Nothing pending: given back by the call itself.
      Var idle = eng.new_owned_var("a test buffer");
      void* r = make(idle);
      CHECK(dev.bytes_in_use() == before + 4096);
      CHECK(eng.delete_owned_var_and_free(idle, kSim1, r, 4096));
      CHECK(dev.bytes_in_use() == before);

      // A CPU node still reads it: refused, nothing done; the var stays
      // usable and the caller records the free.
      Var shared = eng.new_owned_var("a test buffer");
      void* t = make(shared);
      auto [open_cpu, cpu] = gate();
      eng.push([cpu](const RunContext&) { cpu.wait(); }, {shared}, {}, PushOptions{});
      CHECK_FALSE(eng.delete_owned_var_and_free(shared, kSim1, t, 4096));
      eng.push([t](const RunContext& ctx) { ctx.stream_device->deallocate(t, 4096, ctx.stream); }, {}, {shared},
               on(kSim1, StreamKind::kCompute, 0, "free"));
      eng.delete_owned_var(shared);
      open_cpu->set_value();
      eng.waitall();
      CHECK(dev.bytes_in_use() == before);

      // Not a stream device.
      Var host = eng.new_owned_var("a test buffer");
      CHECK_THROWS_AS((void)eng.delete_owned_var_and_free(host, Device{}, nullptr, 1), InvalidArgument);
      eng.delete_owned_var(host);
    }
  }

  TEST_CASE("Streams.AnOwnedBufferIsFreedWhenItsDeviceFaults" * doctest::timeout(60)) {
    // The pending access faults the device: every launch fails, the
    // completions still come, and the last gives the buffer back.
    Engine eng(threaded());
    StreamDevice& dev = eng.stream_device(kSim1);
    const std::size_t before = dev.bytes_in_use();
    Var v = eng.new_owned_var("a test buffer");
    void* p = nullptr;
    eng.push([&p](const RunContext& ctx) { p = ctx.stream_device->allocate(4096, ctx.stream); }, {}, {v},
             on(kSim1));
    eng.waitall();
    REQUIRE(p != nullptr);
    std::promise<void> go;
    std::shared_future<void> going = go.get_future().share();
    eng.push([going](const RunContext& ctx) {
      going.wait();
      sim::fault(ctx, "illegal address");
    }, {v}, {}, on(kSim1));
    eng.push([](const RunContext&) {}, {v}, {}, on(kSim1, StreamKind::kCopyOut));
    CHECK(eng.delete_owned_var_and_free(v, kSim1, p, 4096));
    CHECK(dev.bytes_in_use() == before + 4096);
    go.set_value();
    CHECK_THROWS_AS(eng.waitall(), OpError);
    CHECK(dev.bytes_in_use() == before);
  }

  TEST_CASE("Streams.SimPoolReusesBlocksBySizeClassWithinItsLimit") {
    using lazydag::engine::detail::BlockCache;
    // Size classes: 64-byte granules up to 4 KiB, then four per power of two.
    CHECK(BlockCache::size_class(0) == 64);
    CHECK(BlockCache::size_class(1) == 64);
    CHECK(BlockCache::size_class(4096) == 4096);
    CHECK(BlockCache::size_class(4097) == 5120);
    CHECK(BlockCache::size_class(36864) == 40960);
    for (std::size_t n = 1; n < (1U << 22); n = n * 3 + 1) {
      const std::size_t c = BlockCache::size_class(n);
      CHECK(c >= n);
      CHECK(c <= n + n / 4 + 64);
      CHECK(c % 64 == 0);
    }
    BlockCache cache(std::size_t{256} << 20);
    void* a = cache.allocate(36864);
    void* b = cache.allocate(36864);
    REQUIRE(a != nullptr);
    REQUIRE(b != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(a) % 64 == 0);
    static_cast<unsigned char*>(a)[40959] = 1;  // the whole class is usable
    cache.deallocate(a, 36864);
    CHECK(cache.cached() == 40960);
    CHECK(cache.allocate(33000) == a);  // same class
    CHECK(cache.cached() == 0);
    void* c = cache.allocate(100);
    CHECK(c != a);
    CHECK(c != b);
    cache.deallocate(a, 36864);
    cache.deallocate(b, 36864);
    cache.deallocate(c, 100);
    CHECK(cache.cached() == 2 * 40960 + 128);
    cache.trim();
    CHECK(cache.cached() == 0);
    // Beyond the limit a freed block goes back to the system, not the cache.
    const std::size_t big = cache.limit() / 2 + 4096;
    void* x = cache.allocate(big);
    void* y = cache.allocate(big);
    REQUIRE(x != nullptr);
    REQUIRE(y != nullptr);
    cache.deallocate(x, big);
    const std::size_t one = cache.cached();
    CHECK(one == BlockCache::size_class(big));
    cache.deallocate(y, big);
    CHECK(cache.cached() == one);
  }

  TEST_CASE("Streams.BadDevicesAreRefusedAndRecordNothing" * doctest::timeout(60)) {
    Engine eng(threaded());
    Var v = eng.new_var();
    const auto recorded = eng.stats().nodes_recorded;
    CHECK_THROWS_AS(eng.push([](const RunContext&) {}, {}, {v}, on(Device{DeviceKind::kSim, 99})),
                    InvalidArgument);
    CHECK_THROWS_AS(eng.push([](const RunContext&) {}, {}, {v}, on(Device{}, StreamKind::kCopyIn)),
                    InvalidArgument);
    CHECK_THROWS_AS((void)eng.stream_device(Device{DeviceKind::kCpu, 0}), InvalidArgument);
    bool gpu_usable = true;
    try {
      (void)eng.stream_device(Device{DeviceKind::kGpu, 0});
    } catch (const BackendUnavailable& e) {
      gpu_usable = false;
      CHECK(std::string(e.what()).find("gpu(0)") != std::string::npos);
      CHECK_THROWS_AS(eng.push([](const RunContext&) {}, {}, {v}, on(Device{DeviceKind::kGpu, 0})),
                      BackendUnavailable);
    }
    CHECK(eng.stats().nodes_recorded == recorded);
    MESSAGE("gpu(0) usable here: " << gpu_usable);
  }
}
