// A Boost.Graph view of an engine's pending (unfinished) nodes and their
// dependency edges: for graph algorithms, checks and export.
#pragma once

#include <lazydag/engine/engine.hpp>

#include <boost/graph/adjacency_list.hpp>

#include <cstdint>
#include <string>
#include <unordered_map>

namespace lazydag::engine {

/// Vertex properties of a PendingGraph.
struct GraphNode {
  std::uint64_t id = 0;  ///< the engine's record-order id
  std::string name;
  Device device;
  int priority = 0;
  bool requested = false;
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
    g[i] = GraphNode{nodes[i].id, nodes[i].name, nodes[i].device, nodes[i].priority,
                     nodes[i].requested};
  }
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    for (std::uint64_t p : nodes[i].preds) {
      auto it = index.find(p);
      if (it != index.end()) boost::add_edge(it->second, i, g);
    }
  }
  return g;
}

}  // namespace lazydag::engine
