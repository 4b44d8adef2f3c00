// Recording allocates nothing in the steady state: a counting global
// operator new (this thread only, only while counting) around pushes and
// waits, once the engine's pools are warm.
#include <doctest/doctest.h>

#include <lazydag/engine/engine.hpp>

#include <link.h>

#include <cstring>
#include <new>

#include "../counting_new.hpp"
#include "support.hpp"

using namespace lazydag;
using namespace lazydag::engine;
using lazydag::test::allocations_in;

namespace {

// The size of the TLS segment of the loaded object whose file name contains
// `name`, or -1 when none is loaded (a static link).
long tls_bytes_of(const char* name) {
  struct Query {
    const char* name;
    long bytes;
  } q{name, -1};
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) {
        auto* query = static_cast<Query*>(data);
        if (info->dlpi_name == nullptr || std::strstr(info->dlpi_name, query->name) == nullptr) return 0;
        query->bytes = 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          if (info->dlpi_phdr[i].p_type == PT_TLS) query->bytes = static_cast<long>(info->dlpi_phdr[i].p_memsz);
        }
        return 1;
      },
      &q);
  return q.bytes;
}

}  // namespace

TEST_SUITE("engine") {
  // The shared engine library is built with its thread-locals in the static
  // TLS block (engine/meson.build): loaded with dlopen, as the Python module
  // loads it, they come out of glibc's small reserve for such libraries.
  TEST_CASE("Build.EngineThreadLocalsFitTheStaticTlsReserve") {
    const long bytes = tls_bytes_of("liblazydag_engine");
    if (bytes < 0) return;  // linked statically
    CHECK(bytes <= 256);
  }

  // The zero counts below mean something only if the counter counts: direct
  // calls of the replaceable functions, which no compiler may elide.
  TEST_CASE("Recording.TheAllocationCounterCounts") {
    CHECK(allocations_in([] { ::operator delete(::operator new(24)); }) == 1);
    CHECK(allocations_in([] {
            ::operator delete(::operator new(96, std::align_val_t{64}), std::align_val_t{64});
            ::operator delete(::operator new(8));
          }) == 2);
    CHECK(allocations_in([] {}) == 0);
  }

  TEST_CASE("Recording.PushAllocatesNothingInTheSteadyState" * doctest::timeout(120)) {
    for (const auto& cfg : test::all_configs()) {
      CAPTURE(cfg.str());
      Engine eng(cfg.options());
      Var x = eng.new_var();
      std::vector<Var> own;
      for (int i = 0; i < 64; ++i) own.push_back(eng.new_var());
      std::uint64_t count = 0;
      std::uint64_t expected = 0;
      std::uint64_t* c = &count;
      auto round = [&] {
        expected += 2000;
        for (int i = 0; i < 2000; ++i) {
          eng.push([c](const RunContext&) { ++*c; }, {x}, {x}, {.name = "inc"});
          eng.push([](const RunContext&) {}, {x}, {own[static_cast<std::size_t>(i % 64)]}, {.name = "read"});
        }
      };
      round();  // warm: node blocks, queue ring, var reader lists
      eng.waitall();
      // The pools grow to the deepest backlog seen, which depends on how far
      // the workers lag behind (far, under a sanitizer): a round that lags
      // more than every earlier one may still grow them once. Steady state
      // means a round that allocates nothing comes, and soon; an engine that
      // allocates per push allocates thousands in every round.
      long pushes = -1;
      for (int attempt = 0; attempt < 8 && pushes != 0; ++attempt) {
        pushes = allocations_in(round);
        eng.waitall();
        CHECK(pushes < 64);
      }
      CHECK(pushes == 0);
      // A wait for a var with a pending write: no allocation either, once
      // the traversal stack has grown.
      auto push_and_wait = [&] {
        expected += 100;
        for (int i = 0; i < 100; ++i) {
          eng.push([c](const RunContext&) { ++*c; }, {x}, {x}, {.name = "inc"});
          eng.wait_to_read(x);
        }
      };
      push_and_wait();
      long waits = -1;
      for (int attempt = 0; attempt < 8 && waits != 0; ++attempt) {
        waits = allocations_in(push_and_wait);
        CHECK(waits < 64);
      }
      CHECK(waits == 0);
      eng.waitall();
      CHECK(count == expected);
    }
  }
}
