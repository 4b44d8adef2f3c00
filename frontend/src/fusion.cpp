// Lazy fusion of elementwise ops.
//
// Each thread has one open group: consecutive elementwise ops on one
// device whose results share one shape. An op joins the group instead of
// being recorded; its result is an array whose storage has a var but no
// buffer, and every storage the group reads or writes points at the group.
// The group is recorded into the engine as one node (ops::fused: the CPU's
// tile interpreter, or on a gpu one kernel running every step) when
//   - the thread records an elementwise op that does not join it (another
//     device or shape, the group full), or
//   - anything else touches one of its storages: every access to an array
//     goes through Access::state, which settles the storage's group first
//     (a blocker, a view, an in-place write, another op, any thread), or
//   - nd::waitall, the thread's exit or the process's exit.
// Recording the group before any other access to its storages keeps the
// engine's view of those accesses in program order: the fused node is
// recorded where its first op would have been, relative to everything
// that touches the same buffers. Results nobody holds live in the
// interpreter's per-tile scratch. An access to one result records that
// result alone; other held results stay gathered (flush_locked). A
// non-elementwise op that touches none of the group's storages records
// nothing of it.
//
// Locking: a group's mutex guards its contents; its storages' `group`
// pointers are set under it and cleared under it after the node is
// recorded. A thread never holds two groups' mutexes: another thread's
// group is settled before the caller takes its own. Groups live in a
// registry and are never freed, so a stale pointer read from a storage
// always names a live mutex (the pointer is checked again under it).
#include "fusion.hpp"

#include <lazydag/ndarray.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <deque>
#include <iostream>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "object_pool.hpp"
#include "storage.hpp"

namespace lazydag {
namespace detail::fusion {

struct Group {
  std::mutex mu;
  std::atomic<bool> open{false};
  Device dev{};
  Shape domain;
  std::vector<ops::FusedStep> steps;
  std::vector<StatePtr> outs;  // step i's result
  std::vector<StatePtr> ext;   // external inputs
  std::vector<Storage*> touched;
  std::vector<const char*> names;  // step i's op
  std::uint64_t stayed = 0;        // bit i: step i's result was held and stayed at a flush
  std::string name;                // the recorded node's, built at each flush
};

namespace {

// A group holds at most this many steps and external inputs; the node's
// per-tile work and scratch grow with both.
constexpr std::size_t kMaxSteps = 32;
constexpr std::size_t kMaxInputs = 16;

std::atomic<int> g_enabled{-1};  // -1: not read from the environment yet

// Groups over fewer elements than this write every held result whenever
// one is needed (Flush::kAll): their arrays stay in cache, where a store
// costs less than the node a later flush would add. Over the 256-element
// arrays of the tour's lesson 3 (err = X w - y read by a reduction of
// err * err, then by a matmul), recording err apart from err * err was
// one more node a step, and the lesson's ratio fell from 1.01-1.14 to
// 0.79-1.01 (two alternated runs each). 64K elements is 256 KiB of
// float32: a store of that much costs about as much as several nodes.
// LAZYDAG_FUSION_SELECT_ELEMENTS sets it (0: always select).
std::int64_t select_elements() {
  static const std::int64_t n = [] {
    const char* s = std::getenv("LAZYDAG_FUSION_SELECT_ELEMENTS");
    if (s == nullptr || *s == '\0') return std::int64_t{1} << 16;
    const std::string_view text(s);
    std::int64_t v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size() || v < 0) {
      throw InvalidArgument("LAZYDAG_FUSION_SELECT_ELEMENTS='" + std::string(text) + "' is not an integer >= 0");
    }
    return v;
  }();
  return n;
}

struct Registry {
  std::mutex mu;
  std::deque<Group> groups;  // never shrinks: addresses stay valid
  std::vector<Group*> free;
};

Registry& registry() {
  // Leaked on purpose: threads that exit after static destruction still
  // return their group.
  static Registry* r = [] {
    (void)nd::engine();  // the engine's exit handler first, so ours runs before it
    auto* reg = new Registry;
    std::atexit([] { flush_all(); });
    return reg;
  }();
  return *r;
}

ops::TensorView view_of(const ArrayState& s) {
  return ops::TensorView{s.storage->data, s.dtype, s.shape, s.strides, s.offset};
}

// The recorded form of a group: what the fused node's function keeps, and
// the views its run passes to the interpreter.
struct Program {
  std::vector<ops::FusedStep> steps;
  std::vector<StatePtr> ext;
  std::vector<StatePtr> kept;  // step i's result, or null when nobody reads it
  Shape domain;
  std::vector<ops::TensorView> in;
  std::vector<ops::TensorView> out;
};

// Programs are reused, with their vectors' capacity: recording and running
// a fused node then allocate nothing once a thread has made a few. Cached
// per thread (the thread that destroys a node's function: its frontend
// thread, or the one that ran it inline), a few at most in use at once.
// ASan builds free every program, so a use after free is still reported.
namespace program_cache {
constexpr std::size_t kMaxCached = kPoolObjects ? 64 : 0;
thread_local bool t_gone = false;  // trivially destructible: readable at thread exit
struct Cache {
  std::vector<Program*> free;
  ~Cache() {
    t_gone = true;
    for (Program* p : free) delete p;
  }
};
Cache& cache() {
  thread_local Cache c;
  return c;
}
}  // namespace program_cache

// Owns one Program; gives it back to the destroying thread's cache, emptied
// of its array references.
class ProgramHandle {
 public:
  ProgramHandle() {
    if (!program_cache::t_gone) {
      auto& free = program_cache::cache().free;
      if (!free.empty()) {
        p_ = free.back();
        free.pop_back();
        return;
      }
    }
    p_ = new Program;
  }
  ProgramHandle(ProgramHandle&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  ProgramHandle& operator=(ProgramHandle&&) = delete;
  ProgramHandle(const ProgramHandle&) = delete;
  ProgramHandle& operator=(const ProgramHandle&) = delete;
  ~ProgramHandle() {
    if (p_ == nullptr) return;
    p_->ext.clear();  // the arrays go now, wherever the program goes
    p_->kept.clear();  // (in and out hold no references: each run sets them)
    if (!program_cache::t_gone) {
      auto& free = program_cache::cache().free;
      if (free.size() < program_cache::kMaxCached) {
        try {
          free.push_back(p_);
          return;
        } catch (...) {  // no room to cache it: freed below
        }
      }
    }
    delete p_;
  }
  Program& operator*() const noexcept { return *p_; }
  Program* operator->() const noexcept { return p_; }

 private:
  Program* p_;
};

// What a flush records.
enum class Flush {
  // Every result a handle holds (waitall, a thread's exit, a group that
  // must make room, an access to one of the group's inputs).
  kAll,
  // The result whose storage is accessed; the other held results stay
  // gathered. Any other storage: as kAll.
  kWanted,
  // Nothing: the results nobody holds are dropped, the held ones stay
  // gathered (a non-elementwise op recorded by the gathering thread).
  kHeld,
};

// Bit i of a step mask: step i.
constexpr std::uint64_t bit(std::size_t i) { return std::uint64_t{1} << i; }

// `mask` and the steps its steps read, transitively.
std::uint64_t closure(const Group& g, std::uint64_t mask) {
  for (std::size_t i = g.steps.size(); i-- > 0;) {
    if ((mask & bit(i)) == 0) continue;
    const ops::FusedStep& st = g.steps[i];
    for (int j = 0; j < st.num_in; ++j) {
      const std::int32_t r = st.in[static_cast<std::size_t>(j)];
      if (r >= 0) mask |= bit(static_cast<std::size_t>(r));
    }
  }
  return mask;
}

// The steps of a mask closed under closure(), renumbered in order, and
// the external inputs they read, renumbered in order too (so that a group
// compacts to a selection in place). No array here is zeroed: only the
// entries a selection uses are written or read.
struct Selection {
  std::array<std::uint8_t, kMaxSteps> from;   // new step -> the group's
  std::array<std::int8_t, kMaxSteps> step_to;  // the group's step -> new
  std::size_t num_steps = 0;
  std::array<std::uint8_t, kMaxInputs> ext_from;  // new input -> the group's
  std::array<std::int8_t, kMaxInputs> ext_to;     // the group's input -> new
  std::size_t num_ext = 0;

  /// Step `st` of the group (a selected one), its operands renumbered.
  [[nodiscard]] ops::FusedStep renumbered(ops::FusedStep st) const {
    for (int j = 0; j < st.num_in; ++j) {
      std::int32_t& r = st.in[static_cast<std::size_t>(j)];
      r = r >= 0 ? step_to[static_cast<std::size_t>(r)] : -1 - ext_to[static_cast<std::size_t>(-1 - r)];
    }
    return st;
  }
};

void select(const Group& g, std::uint64_t mask, Selection& s) {
  std::uint32_t used = 0;  // bit k: external input k is read
  for (std::size_t i = 0; i < g.steps.size(); ++i) {
    if ((mask & bit(i)) == 0) continue;
    const ops::FusedStep& st = g.steps[i];
    for (int j = 0; j < st.num_in; ++j) {
      const std::int32_t r = st.in[static_cast<std::size_t>(j)];
      if (r < 0) used |= std::uint32_t{1} << (-1 - r);
    }
    s.step_to[i] = static_cast<std::int8_t>(s.num_steps);
    s.from[s.num_steps++] = static_cast<std::uint8_t>(i);
  }
  for (std::size_t k = 0; k < g.ext.size(); ++k) {
    if ((used >> k & 1) == 0) continue;
    s.ext_to[k] = static_cast<std::int8_t>(s.num_ext);
    s.ext_from[s.num_ext++] = static_cast<std::uint8_t>(k);
  }
}

// "fused[a,b,...]" of a selection's steps, into `out`.
void name_of(const Group& g, const Selection& s, std::string& out) {
  out = "fused[";
  for (std::size_t k = 0; k < s.num_steps; ++k) {
    if (k != 0) out += ',';
    out += g.names[s.from[k]];
  }
  out += ']';
}

// One op on the CPU, its result kept (most often one a wait needs at once,
// recorded alone): the op's own kernel on views made when it runs, with
// no program. Its closure fits the engine function's inline buffer. On a
// waited one-element `x + 1` the program (its vectors, the interpreter's
// set-up) was a quarter of the fused path's time.
constexpr std::size_t kOneInputs = 3;
void record_one(Group& g, const Selection& now, std::span<const engine::Var> reads, std::size_t read_bytes) {
  struct One {
    ops::FusedStep step;
    std::array<StatePtr, kOneInputs> in;
    StatePtr out;
  };
  One one{now.renumbered(g.steps[now.from[0]]), {}, g.outs[now.from[0]]};
  for (std::size_t k = 0; k < now.num_ext; ++k) one.in[k] = g.ext[now.ext_from[k]];
  Storage& s = *one.out->storage;
  // Its var and memory now (a throw leaves the group open).
  s.ensure_var();
  if (s.data == nullptr) s.allocate();
  const engine::Var writes[] = {s.var};
  name_of(g, now, g.name);
  engine::PushOptions o;
  o.device = g.dev;
  o.name = g.name;
  // As record_selected's: the inputs, the result, a byte per element.
  o.cost_bytes = std::max<std::size_t>(read_bytes + s.bytes + static_cast<std::size_t>(numel(g.domain)), 1);
  static_assert(sizeof(One) <= engine::Function::kInlineBytes, "recording one op allocates nothing");
  nd::engine().push(
      [one = std::move(one)](const engine::RunContext& ctx) {
        std::array<ops::TensorView, kOneInputs> in;
        std::size_t n = 0;
        while (n < kOneInputs && one.in[n]) {
          in[n] = view_of(*one.in[n]);
          ++n;
        }
        const ops::TensorView out[] = {view_of(*one.out)};
        ops::fused(ctx, std::span(&one.step, 1), std::span<const ops::TensorView>(in.data(), n), out,
                   one.out->shape);
      },
      reads, writes, o);
}

// Records the steps of `keep`'s results (and those they read) of `g` as
// one node writing those results.
void record_selected(Group& g, std::uint64_t keep) {
  Selection now;
  select(g, closure(g, keep), now);
  const std::size_t num_ext = now.num_ext;
  const std::size_t num_steps = now.num_steps;
  // The engine's reads: the external inputs' vars, each once.
  std::array<engine::Var, kMaxInputs> reads;
  std::array<const Storage*, kMaxInputs> seen;
  std::size_t num_reads = 0;
  // Bookkeeping arrays are filled only as far as they are used (zeroing
  // all of them was a quarter of this function's time on tiny groups).
  std::array<std::uint64_t, kMaxInputs> read_of;  // external input -> its read's bit
  for (std::size_t k = 0; k < num_ext; ++k) {
    const Storage* s = g.ext[now.ext_from[k]]->storage.get();
    std::size_t r = 0;
    while (r < num_reads && seen[r] != s) ++r;
    if (r == num_reads) {
      seen[r] = s;
      reads[r] = s->var;
      ++num_reads;
    }
    read_of[k] = std::uint64_t{1} << r;
  }
  std::size_t read_bytes = 0;  // each input's buffer once, for the cost hint
  for (std::size_t r = 0; r < num_reads; ++r) read_bytes += seen[r]->bytes;
  if (num_steps == 1 && num_ext <= kOneInputs && !g.dev.is_stream_device()) {
    record_one(g, now, std::span<const engine::Var>(reads.data(), num_reads), read_bytes);
    return;
  }
  // Which reads each step's result is computed from: a failed input then
  // fails only the results that depend on it, as the separate ops would.
  // The program's steps are renumbered once, here, and read below.
  ProgramHandle p;
  p->steps.clear();
  for (std::size_t i = 0; i < num_steps; ++i) p->steps.push_back(now.renumbered(g.steps[now.from[i]]));
  std::array<std::uint64_t, kMaxSteps> sources;
  for (std::size_t i = 0; i < num_steps; ++i) {
    const ops::FusedStep& st = p->steps[i];
    sources[i] = 0;
    for (int j = 0; j < st.num_in; ++j) {
      const std::int32_t r = st.in[static_cast<std::size_t>(j)];
      sources[i] |= r >= 0 ? sources[static_cast<std::size_t>(r)] : read_of[static_cast<std::size_t>(-1 - r)];
    }
  }
  std::array<engine::Var, kMaxSteps> writes;
  std::array<std::uint64_t, kMaxSteps> write_sources;
  std::size_t num_writes = 0;
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < num_steps; ++i) {
    if ((keep & bit(now.from[i])) == 0) continue;
    Storage& s = *g.outs[now.from[i]]->storage;
    // Its var and host memory now (a throw leaves the group open); a
    // stream device's buffer is allocated by the node, on its stream.
    s.ensure_var();
    if (!g.dev.is_stream_device() && s.data == nullptr) s.allocate();
    bytes += s.bytes;
    writes[num_writes] = s.var;
    write_sources[num_writes] = sources[i];
    ++num_writes;
  }
  p->kept.resize(num_steps);
  for (std::size_t i = 0; i < num_steps; ++i) {
    if ((keep & bit(now.from[i])) != 0) p->kept[i] = g.outs[now.from[i]];
  }
  p->ext.clear();
  for (std::size_t k = 0; k < num_ext; ++k) p->ext.push_back(g.ext[now.ext_from[k]]);
  p->domain = g.domain;
  name_of(g, now, g.name);
  engine::PushOptions o;
  o.device = g.dev;
  o.name = g.name;
  o.write_sources = std::span<const std::uint64_t>(write_sources.data(), num_writes);
  if (g.dev.is_stream_device()) o.bytes = bytes;
  // The cost hint: the inputs and kept results, and a byte per element
  // and step for the work in cache.
  o.cost_bytes = std::max<std::size_t>(read_bytes + bytes + num_steps * static_cast<std::size_t>(numel(g.domain)), 1);
  nd::engine().push(
      [p = std::move(p)](const engine::RunContext& ctx) {
        Program& q = *p;
        for (const StatePtr& k : q.kept) {
          if (k) k->storage->ensure(ctx);  // a stream device's result: its buffer, in stream order
        }
        q.in.clear();
        for (const StatePtr& e : q.ext) q.in.push_back(view_of(*e));
        q.out.assign(q.kept.size(), ops::TensorView{});
        for (std::size_t i = 0; i < q.kept.size(); ++i) {
          if (q.kept[i]) q.out[i] = view_of(*q.kept[i]);
        }
        ops::fused(ctx, q.steps, q.in, q.out, q.domain);  // a CPU loop over tiles, or one CUDA kernel
      },
      std::span<const engine::Var>(reads.data(), num_reads), std::span<const engine::Var>(writes.data(), num_writes),
      o);
}

// Records what `how` asks of `g` (its mutex held). The group is left with
// the held results that stay gathered and the steps they read (a step
// both need is computed again later, in scratch). Held results that
// stay are most often a full expression's temporaries, alive until the
// end of `f(x * w + b).wait_to_read()`: written, they would cost a full
// pass over memory each (docs/architecture.md, "What is materialised").
void flush_locked(Group& g, Flush how = Flush::kAll, const Storage* wanted = nullptr) {
  if (!g.open.load(std::memory_order_relaxed)) return;
  if (how != Flush::kAll && numel(g.domain) < select_elements()) how = Flush::kAll;
  const std::size_t num_steps = g.steps.size();
  // The group's reference and at least one more: a handle holds it.
  std::uint64_t held = 0;
  for (std::size_t i = 0; i < num_steps; ++i) {
    if (g.outs[i].use_count() > 1) held |= bit(i);
  }
  std::uint64_t keep = held;
  if (how == Flush::kHeld) {
    keep = 0;
  } else if (how == Flush::kWanted) {
    // The result accessed, and the held results that already stayed at an
    // earlier flush: they outlived their expression, so they are more than
    // temporaries, and are written now rather than computed again later
    // (a result is computed twice at most).
    std::size_t w = 0;
    while (w < num_steps && (!g.outs[w] || g.outs[w]->storage.get() != wanted)) ++w;
    if (w < num_steps) keep = bit(w) | (held & g.stayed);
  }
  // The results that stay are gathered again from the group's inputs,
  // never from a result recorded now: the access that settles it may be an
  // in-place write, recorded after this returns.
  const std::uint64_t stay = held & ~keep;
  Selection later;
  if (stay != 0) select(g, closure(g, stay), later);
  if (keep == 0 && later.num_steps == num_steps) {  // nothing to record or drop
    g.stayed = stay;
    return;
  }
  if (keep != 0) record_selected(g, keep);
  // Recorded (or nothing to compute: no result is held): the storages the
  // group no longer reads or writes need not settle.
  std::array<const Storage*, kMaxSteps + kMaxInputs> still;
  std::size_t num_still = 0;
  for (std::size_t k = 0; k < later.num_steps; ++k) {
    const StatePtr& out = g.outs[later.from[k]];
    if (out && (keep & bit(later.from[k])) == 0) still[num_still++] = out->storage.get();
  }
  for (std::size_t k = 0; k < later.num_ext; ++k) still[num_still++] = g.ext[later.ext_from[k]]->storage.get();
  std::size_t num_touched = 0;
  for (Storage* s : g.touched) {
    if (std::find(still.begin(), still.begin() + static_cast<std::ptrdiff_t>(num_still), s) !=
        still.begin() + static_cast<std::ptrdiff_t>(num_still)) {
      g.touched[num_touched++] = s;
    } else {
      s->group.store(nullptr, std::memory_order_release);
    }
  }
  g.touched.resize(num_touched);
  if (later.num_steps == 0) {
    g.stayed = 0;
    g.steps.clear();
    g.outs.clear();
    g.ext.clear();
    g.names.clear();
    g.open.store(false, std::memory_order_relaxed);
    return;
  }
  // The group becomes the selection, compacted in place (a selected step
  // or input moves only to a lower index). A result recorded now that a
  // result staying reads is computed again, into scratch: its step keeps
  // no array (a later op that reads the array reads what was written, and
  // whatever was written into it since).
  g.stayed = 0;
  for (std::size_t k = 0; k < later.num_steps; ++k) {
    const std::size_t j = later.from[k];
    if ((stay & bit(j)) != 0) g.stayed |= bit(k);
    g.steps[k] = later.renumbered(g.steps[j]);
    if ((keep & bit(j)) != 0) {
      g.outs[k].reset();
    } else if (k != j) {
      g.outs[k] = std::move(g.outs[j]);
    }
    g.names[k] = g.names[j];
  }
  g.steps.resize(later.num_steps);
  g.outs.resize(later.num_steps);
  g.names.resize(later.num_steps);
  for (std::size_t k = 0; k < later.num_ext; ++k) {
    if (k != later.ext_from[k]) g.ext[k] = std::move(g.ext[later.ext_from[k]]);
  }
  g.ext.resize(later.num_ext);
}

// The calling thread's group, returned to the registry (recorded first)
// when the thread exits.
struct Mine {
  Group* g = nullptr;
  ~Mine() {
    if (g == nullptr) return;
    try {
      std::lock_guard lk(g->mu);
      flush_locked(*g);
    } catch (const std::exception& e) {  // a destructor never throws
      std::cerr << "lazydag: could not record a thread's fused ops at its exit: " << e.what() << '\n';
    }
    Registry& r = registry();
    std::lock_guard lk(r.mu);
    r.free.push_back(g);
  }
};
thread_local Mine tls_mine;

Group& mine() {
  if (tls_mine.g == nullptr) {
    Registry& r = registry();
    std::lock_guard lk(r.mu);
    if (!r.free.empty()) {
      tls_mine.g = r.free.back();
      r.free.pop_back();
    } else {
      tls_mine.g = &r.groups.emplace_back();
    }
  }
  return *tls_mine.g;
}

void settle_storage(const Storage& s) {
  Group* h = s.group.load(std::memory_order_acquire);
  if (h == nullptr) return;
  std::lock_guard lk(h->mu);
  if (s.group.load(std::memory_order_relaxed) == h) flush_locked(*h, Flush::kWanted, &s);
}

}  // namespace

bool active() {
  int on = g_enabled.load(std::memory_order_relaxed);
  if (on < 0) {
    const char* e = std::getenv("LAZYDAG_FUSION");
    on = (e != nullptr && std::string_view(e) == "0") ? 0 : 1;
    int expected = -1;
    if (!g_enabled.compare_exchange_strong(expected, on, std::memory_order_relaxed)) on = expected;
  }
  return on != 0 && nd::engine().policy() != engine::Policy::kNaive;
}

void settle(const ArrayState& s) {
  if (s.storage && s.storage->group.load(std::memory_order_acquire) != nullptr) settle_storage(*s.storage);
}

void flush_mine() {
  Group* g = tls_mine.g;
  if (g == nullptr || !g->open.load(std::memory_order_relaxed)) return;
  std::lock_guard lk(g->mu);
  flush_locked(*g, Flush::kHeld);
}

void flush_all() {
  std::vector<Group*> all;
  {
    Registry& r = registry();
    std::lock_guard lk(r.mu);
    for (Group& g : r.groups) all.push_back(&g);
  }
  for (Group* g : all) {
    if (!g->open.load(std::memory_order_acquire)) continue;
    std::lock_guard lk(g->mu);
    flush_locked(*g);
  }
}

StatePtr append(ops::FusedStep step, InputRefs inputs, const Shape& shape, DType t, Device dev, const char* name) {
  Group& g = mine();
  for (;;) {
    // Inputs in another thread's open group: that group is recorded first,
    // never while this thread holds its own group's mutex.
    for (const StatePtr& in : inputs) {
      Group* h = in->storage->group.load(std::memory_order_acquire);
      if (h != nullptr && h != &g) settle_storage(*in->storage);
    }
    std::unique_lock lk(g.mu);
    bool foreign = false;
    for (const StatePtr& in : inputs) {
      Group* h = in->storage->group.load(std::memory_order_acquire);
      foreign = foreign || (h != nullptr && h != &g);
    }
    if (foreign) continue;  // another thread took one in meanwhile: again
    if (g.open.load(std::memory_order_relaxed) &&
        (!(g.dev == dev) || g.domain != shape || g.steps.size() >= kMaxSteps ||
         g.ext.size() + inputs.size() > kMaxInputs)) {
      flush_locked(g);
    }
    // The result first: creating it may throw, and nothing has changed yet
    // (the group's vectors hold a full group: the pushes below and a
    // flush's rebuild never allocate).
    if (g.steps.capacity() < kMaxSteps) {
      g.steps.reserve(kMaxSteps);
      g.outs.reserve(kMaxSteps);
      g.names.reserve(kMaxSteps);
      g.ext.reserve(kMaxInputs);
      g.touched.reserve(kMaxSteps + kMaxInputs);
    }
    auto out = make_pooled<ArrayState>();
    out->storage =
        make_pooled<Storage>(nd::engine(), dev, static_cast<std::size_t>(numel(shape)) * size_of(t), true);
    out->shape = shape;
    out->strides = contiguous_strides(shape);
    out->dtype = t;
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      const StatePtr& in = inputs[k];
      const ArrayState* a = in.get();
      std::int32_t ref = 0;
      bool found = false;
      if (a->storage->group.load(std::memory_order_relaxed) == &g) {
        for (std::size_t j = 0; j < g.outs.size() && !found; ++j) {
          if (g.outs[j].get() == a) {
            ref = static_cast<std::int32_t>(j);
            found = true;
          }
        }
        for (std::size_t j = 0; j < g.ext.size() && !found; ++j) {
          if (g.ext[j].get() == a) {
            ref = -1 - static_cast<std::int32_t>(j);
            found = true;
          }
        }
      }
      if (!found) {
        g.ext.push_back(in);
        ref = -1 - static_cast<std::int32_t>(g.ext.size() - 1);
        if (a->storage->group.load(std::memory_order_relaxed) != &g) {
          a->storage->group.store(&g, std::memory_order_release);
          g.touched.push_back(a->storage.get());
        }
      }
      step.in[k] = ref;
    }
    step.num_in = static_cast<std::uint8_t>(inputs.size());
    step.dtype = t;
    out->storage->group.store(&g, std::memory_order_release);
    g.touched.push_back(out->storage.get());
    if (!g.open.load(std::memory_order_relaxed)) {
      g.dev = dev;
      g.domain = shape;
    }
    g.names.push_back(name);
    g.steps.push_back(step);
    g.outs.push_back(out);
    g.open.store(true, std::memory_order_relaxed);
    return out;
  }
}

}  // namespace detail::fusion

namespace nd {

void set_fusion(bool on) {
  detail::fusion::flush_all();
  detail::fusion::g_enabled.store(on ? 1 : 0, std::memory_order_relaxed);
}

void flush_fused() { detail::fusion::flush_all(); }

bool fusion_enabled() {
  (void)detail::fusion::active();
  return detail::fusion::g_enabled.load(std::memory_order_relaxed) == 1;
}

}  // namespace nd
}  // namespace lazydag
