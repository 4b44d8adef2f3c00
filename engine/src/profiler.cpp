// The profiler: per-thread event buffers and the Chrome trace-event writer.
#include <lazydag/engine/error.hpp>
#include <lazydag/engine/profiler.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <unordered_map>

#include "profiler_internal.hpp"

namespace lazydag::profiler {

namespace detail {

std::atomic<bool> g_on{false};

namespace {

// One per thread that ever recorded. Its own mutex is only contended by
// dump(), never by other recording threads.
// Events are appended to fixed-capacity chunks, so a growing buffer never
// moves the events it holds.
template <class T>
class ChunkedLog {
 public:
  static constexpr std::size_t kChunk = 4096;
  void push(T&& e) {
    if (chunks_.empty() || chunks_.back().size() == kChunk) {
      chunks_.emplace_back();
      chunks_.back().reserve(kChunk);
    }
    chunks_.back().push_back(std::move(e));
  }
  [[nodiscard]] std::size_t size() const {
    return chunks_.empty() ? 0 : (chunks_.size() - 1) * kChunk + chunks_.back().size();
  }
  template <class F>
  void for_each(F&& f) const {
    for (const auto& c : chunks_) {
      for (const auto& e : c) f(e);
    }
  }
  void clear() { chunks_.clear(); }

 private:
  std::vector<std::vector<T>> chunks_;
};

struct ThreadBuffer {
  std::mutex mu;
  int tid = 0;
  std::string name;
  ChunkedLog<NodeEvent> nodes;
  ChunkedLog<FrontendEvent> frontend;
};

struct Registry {
  std::mutex mu;  // guards `buffers` (taken once per thread, and by dump)
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
};

// Never destroyed: threads may record during static destruction.
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

ThreadBuffer& local_buffer() {
  thread_local std::shared_ptr<ThreadBuffer> mine = [] {
    auto b = std::make_shared<ThreadBuffer>();
    Registry& r = registry();
    std::lock_guard lk(r.mu);
    b->tid = static_cast<int>(r.buffers.size()) + 1;
    b->name = "thread " + std::to_string(b->tid);
    r.buffers.push_back(b);
    return b;
  }();
  return *mine;
}

}  // namespace

void record(NodeEvent&& e) {
  ThreadBuffer& b = local_buffer();
  std::lock_guard lk(b.mu);
  b.nodes.push(std::move(e));
}

void record(FrontendEvent&& e) {
  ThreadBuffer& b = local_buffer();
  std::lock_guard lk(b.mu);
  if (b.name.rfind("thread ", 0) == 0) b.name = "frontend " + std::to_string(b.tid);
  b.frontend.push(std::move(e));
}

void name_thread(const std::string& name) {
  ThreadBuffer& b = local_buffer();
  std::lock_guard lk(b.mu);
  b.name = name;
}

}  // namespace detail

namespace {

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string us(std::uint64_t ns, std::uint64_t base) {
  char buf[32];
  // Signed: clocks of different sources (host, device) may disagree slightly.
  std::snprintf(buf, sizeof buf, "%.3f",
                static_cast<double>(static_cast<std::int64_t>(ns - base)) / 1000.0);
  return buf;
}

std::string json_list(const std::vector<std::uint64_t>& v, std::size_t from, std::size_t to) {
  std::string s = "[";
  for (std::size_t i = from; i < to; ++i) s += (i > from ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

void start() { detail::g_on.store(true, std::memory_order_relaxed); }
void stop() { detail::g_on.store(false, std::memory_order_relaxed); }
bool running() noexcept { return detail::on(); }

std::size_t event_count() {
  detail::Registry& r = detail::registry();
  std::lock_guard lk(r.mu);
  std::size_t n = 0;
  for (auto& b : r.buffers) {
    std::lock_guard bl(b->mu);
    n += b->nodes.size() + b->frontend.size();
  }
  return n;
}

void dump(const std::string& path) {
  struct Taken {
    int tid;
    std::string name;
    detail::ChunkedLog<detail::NodeEvent> nodes;
    detail::ChunkedLog<detail::FrontendEvent> frontend;
  };
  std::vector<Taken> taken;
  {
    detail::Registry& r = detail::registry();
    std::lock_guard lk(r.mu);
    for (auto& b : r.buffers) {
      std::lock_guard bl(b->mu);
      taken.push_back(Taken{b->tid, b->name, std::move(b->nodes), std::move(b->frontend)});
      b->nodes.clear();
      b->frontend.clear();
    }
  }
  std::uint64_t base = UINT64_MAX;
  // A CPU node is shown on the thread that ran it; a stream-device node on a
  // track of its stream ("gpu(0) stream 1", "sim(0) copy in"), whichever
  // thread reported it, with the device's interval.
  int next_tid = 1;
  for (const auto& t : taken) next_tid = std::max(next_tid, t.tid + 1);
  std::map<std::pair<std::string, int>, std::pair<int, std::string>> stream_tracks;
  auto track_of = [&](const Taken& t, const detail::NodeEvent& e) {
    if (e.stream < 0) return t.tid;
    auto [it, fresh] = stream_tracks.try_emplace({e.device.str(), e.stream});
    if (fresh) {
      const std::string kind = e.stream < e.compute_streams       ? "stream " + std::to_string(e.stream)
                               : e.stream == e.compute_streams ? std::string("copy in")
                                                               : std::string("copy out");
      it->second = {next_tid++, e.device.str() + " " + kind};
    }
    return it->second.first;
  };
  // Where each node ran, for the flow arrows from producer to consumer.
  struct Where {
    int tid;
    std::uint64_t end;
  };
  std::unordered_map<std::uint64_t, std::unordered_map<std::uint64_t, Where>> ran;
  std::set<int> thread_tracks;  // threads with something on their own track
  for (const auto& t : taken) {
    t.nodes.for_each([&](const detail::NodeEvent& e) {
      base = std::min(base, e.t_push);
      if (e.t_launch_start != 0) base = std::min(base, e.t_launch_start);
      base = std::min(base, e.t_start);
      const int tid = track_of(t, e);
      if (tid == t.tid) thread_tracks.insert(t.tid);
      ran[e.engine][e.id] = Where{tid, e.t_end};
    });
    t.frontend.for_each([&](const detail::FrontendEvent& e) { base = std::min(base, e.t0); });
    if (t.frontend.size() != 0) thread_tracks.insert(t.tid);
  }
  if (base == UINT64_MAX) base = 0;

  std::ostringstream os;
  os << "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
  bool first = true;
  auto emit = [&](const std::string& ev) {
    os << (first ? "" : ",\n") << ev;
    first = false;
  };
  emit("{\"ph\":\"M\",\"pid\":1,\"name\":\"process_name\",\"args\":{\"name\":\"lazydag\"}}");
  std::uint64_t flow = 0;
  auto name_track = [&](int tid, const std::string& name) {
    emit("{\"ph\":\"M\",\"pid\":1,\"tid\":" + std::to_string(tid) +
         ",\"name\":\"thread_name\",\"args\":{\"name\":" + json_string(name) + "}}");
  };
  for (const auto& [key, track] : stream_tracks) name_track(track.first, track.second);
  for (const auto& t : taken) {
    if (thread_tracks.count(t.tid) != 0) name_track(t.tid, t.name);
    t.nodes.for_each([&](const detail::NodeEvent& e) {
      const int tid = ran[e.engine][e.id].tid;
      const std::size_t r_end = e.num_reads;
      const std::size_t w_end = r_end + e.num_writes;
      std::string args = "{\"id\":" + std::to_string(e.id) + ",\"engine\":" + std::to_string(e.engine) +
                         ",\"device\":" + json_string(e.device.str()) + ",\"worker\":" +
                         std::to_string(e.worker) + ",\"reads\":" + json_list(e.ids, 0, r_end) +
                         ",\"writes\":" + json_list(e.ids, r_end, w_end) +
                         ",\"preds\":" + json_list(e.ids, w_end, e.ids.size()) +
                         ",\"push_us\":" + us(e.t_push, base) + ",\"ready_us\":" + us(e.t_ready, base) +
                         ",\"queued_us\":" + us(e.t_start, e.t_ready) + ",\"status\":" +
                         json_string(e.failed ? "failed" : e.skipped ? "skipped" : "ok");
      if (e.stream >= 0) {
        args += ",\"stream\":" + std::to_string(e.stream);
        if (e.t_launch_end != 0) {
          args += ",\"launch_us\":" + us(e.t_launch_start, base) +
                  ",\"launch_dur_us\":" + us(e.t_launch_end, e.t_launch_start);
        }
      }
      args += "}";
      emit("{\"ph\":\"X\",\"cat\":\"op\",\"pid\":1,\"tid\":" + std::to_string(tid) +
           ",\"name\":" + json_string(e.name) + ",\"ts\":" + us(e.t_start, base) +
           ",\"dur\":" + us(e.t_end, e.t_start) + ",\"args\":" + args + "}");
      for (std::size_t pi = w_end; pi < e.ids.size(); ++pi) {
        const std::uint64_t p = e.ids[pi];
        auto eng = ran.find(e.engine);
        if (eng == ran.end()) continue;
        auto it = eng->second.find(p);
        if (it == eng->second.end()) continue;  // the producer ran before the profiler started
        const std::string id = std::to_string(++flow);
        emit("{\"ph\":\"s\",\"cat\":\"dep\",\"name\":\"dep\",\"id\":" + id + ",\"pid\":1,\"tid\":" +
             std::to_string(it->second.tid) + ",\"ts\":" +
             us(it->second.end > base ? it->second.end - 1 : it->second.end, base) + "}");
        emit("{\"ph\":\"f\",\"bp\":\"e\",\"cat\":\"dep\",\"name\":\"dep\",\"id\":" + id +
             ",\"pid\":1,\"tid\":" + std::to_string(tid) + ",\"ts\":" + us(e.t_start, base) + "}");
      }
    });
    t.frontend.for_each([&](const detail::FrontendEvent& e) {
      emit("{\"ph\":\"X\",\"cat\":" + json_string(e.category) + ",\"pid\":1,\"tid\":" +
           std::to_string(t.tid) + ",\"name\":" + json_string(e.name) + ",\"ts\":" + us(e.t0, base) +
           ",\"dur\":" + us(e.t1, e.t0) + ",\"args\":{\"where\":" + json_string(e.where) + "}}");
    });
  }
  os << "\n]}\n";
  std::ofstream out(path);
  if (!out) throw Error("profiler::dump: cannot write " + path);
  out << os.str();
  if (!out) throw Error("profiler::dump: write to " + path + " failed");
}

namespace {

// LAZYDAG_PROFILE=trace.json: profile the whole run. Registered at load, so
// the dump runs after the exit handler that finishes the recorded work.
struct WholeRun {
  WholeRun() {
    const char* path = std::getenv("LAZYDAG_PROFILE");
    if (path == nullptr || *path == '\0') return;
    static std::string file = path;
    start();
    std::atexit([] {
      try {
        dump(file);
      } catch (const std::exception& e) {
        std::cerr << "lazydag: " << e.what() << '\n';
      }
    });
  }
};
const WholeRun whole_run;

}  // namespace
}  // namespace lazydag::profiler
