// A Boost.Graph view of an engine's pending (unfinished) nodes and their
// dependency edges: for graph algorithms, checks and export.
#pragma once

#include <lazydag/engine/engine.hpp>

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/graphviz.hpp>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <optional>
#include <ostream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace lazydag::engine {

/// Vertex properties of a PendingGraph.
struct GraphNode {
  std::uint64_t id = 0;  ///< the engine's record-order id
  std::string name;
  Device device;
  int priority = 0;
  bool requested = false;
  std::vector<Var> reads;
  std::vector<Var> writes;
};

/// Vertices in record order; an edge u -> v means v waits for u.
using PendingGraph =
    boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS, GraphNode>;

/// Snapshot of the engine's unfinished nodes. Briefly takes the engine's
/// lock; thread-safe; does not wait for or run anything.
inline PendingGraph pending_graph(const Engine& eng) {
  std::vector<PendingNode> nodes = eng.pending_nodes();
  PendingGraph g(nodes.size());
  std::unordered_map<std::uint64_t, std::size_t> index;
  index.reserve(nodes.size());
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    index.emplace(nodes[i].id, i);
    g[i] = GraphNode{nodes[i].id,       nodes[i].name,  nodes[i].device, nodes[i].priority,
                     nodes[i].requested, nodes[i].reads, nodes[i].writes};
  }
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    for (std::uint64_t p : nodes[i].preds) {
      auto it = index.find(p);
      if (it != index.end()) boost::add_edge(it->second, i, g);
    }
  }
  return g;
}

/// The subgraph `wait_to_read(v)` would run: the pending last writer of `v`
/// and its pending ancestors (empty when nothing pending writes `v`).
inline PendingGraph required_subgraph(const PendingGraph& g, Var v) {
  std::optional<std::size_t> writer;
  for (std::size_t i = 0; i < boost::num_vertices(g); ++i) {
    if (std::find(g[i].writes.begin(), g[i].writes.end(), v) != g[i].writes.end()) writer = i;
  }
  std::vector<std::size_t> keep;
  if (writer) {
    std::unordered_set<std::size_t> seen{*writer};
    std::vector<std::size_t> stack{*writer};
    while (!stack.empty()) {
      const std::size_t u = stack.back();
      stack.pop_back();
      for (auto e : boost::make_iterator_range(boost::in_edges(u, g))) {
        const std::size_t p = boost::source(e, g);
        if (seen.insert(p).second) stack.push_back(p);
      }
    }
    keep.assign(seen.begin(), seen.end());
    std::sort(keep.begin(), keep.end());
  }
  PendingGraph sub(keep.size());
  std::unordered_map<std::size_t, std::size_t> index;
  for (std::size_t i = 0; i < keep.size(); ++i) {
    index.emplace(keep[i], i);
    sub[i] = g[keep[i]];
  }
  for (std::size_t i = 0; i < keep.size(); ++i) {
    for (auto e : boost::make_iterator_range(boost::in_edges(keep[i], g))) {
      boost::add_edge(index.at(boost::source(e, g)), i, sub);
    }
  }
  return sub;
}

/// A longest path (counted in nodes) through the DAG: the chain of ops that
/// bounds how fast the graph can run however many workers there are.
/// Vertices are in record order, which is a topological order.
inline std::vector<std::size_t> critical_path(const PendingGraph& g) {
  const std::size_t n = boost::num_vertices(g);
  if (n == 0) return {};
  std::vector<std::size_t> length(n, 1);
  std::vector<std::size_t> prev(n, n);
  for (std::size_t v = 0; v < n; ++v) {
    for (auto e : boost::make_iterator_range(boost::in_edges(v, g))) {
      const std::size_t u = boost::source(e, g);
      if (length[u] + 1 > length[v]) {
        length[v] = length[u] + 1;
        prev[v] = u;
      }
    }
  }
  std::size_t end = static_cast<std::size_t>(std::max_element(length.begin(), length.end()) - length.begin());
  std::vector<std::size_t> path;
  for (std::size_t v = end; v != n; v = prev[v]) path.push_back(v);
  std::reverse(path.begin(), path.end());
  return path;
}

/// Graphviz DOT of `g` (Boost.Graph's write_graphviz): each op labelled with
/// its name, id, device and vars; the critical path drawn in red.
inline void write_dot(std::ostream& os, const PendingGraph& g) {
  const std::vector<std::size_t> path = critical_path(g);
  std::vector<bool> on_path(boost::num_vertices(g), false);
  for (std::size_t v : path) on_path[v] = true;
  auto var_list = [](const std::vector<Var>& vars) {
    std::string s;
    for (const Var& v : vars) s += (s.empty() ? "v" : " v") + std::to_string(v.index);
    return s.empty() ? std::string("-") : s;
  };
  auto vertex_writer = [&](std::ostream& out, std::size_t v) {
    const GraphNode& n = g[v];
    out << "[label=\"" << n.name << " #" << n.id << "\\n" << n.device.str() << "\\nreads "
        << var_list(n.reads) << "\\nwrites " << var_list(n.writes) << "\"";
    if (on_path[v]) out << ", color=red, penwidth=2";
    if (!n.requested) out << ", style=dashed";
    out << "]";
  };
  auto edge_writer = [&](std::ostream& out, const PendingGraph::edge_descriptor& e) {
    const std::size_t u = boost::source(e, g);
    const std::size_t v = boost::target(e, g);
    auto it = std::find(path.begin(), path.end(), u);
    if (it != path.end() && it + 1 != path.end() && *(it + 1) == v) out << "[color=red, penwidth=2]";
  };
  auto graph_writer = [](std::ostream& out) {
    out << "rankdir=TB;\nnode [shape=box, fontname=\"Helvetica\", fontsize=10];\n";
  };
  boost::write_graphviz(os, g, vertex_writer, edge_writer, graph_writer);
}

/// Writes the engine's pending graph (or, with `v`, the subgraph a
/// wait_to_read(v) would run) as Graphviz DOT to `path`. Briefly takes the
/// engine's lock; runs nothing. Throws Error when the file cannot be written.
inline void dump_graph(const Engine& eng, const std::string& path, std::optional<Var> v = std::nullopt) {
  PendingGraph g = pending_graph(eng);
  if (v) g = required_subgraph(g, *v);
  std::ofstream out(path);
  if (!out) throw Error("dump_graph: cannot write " + path);
  write_dot(out, g);
}

}  // namespace lazydag::engine
