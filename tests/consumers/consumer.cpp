// A program outside the lazydag tree, built against an installed lazydag
// (pkg-config, CMake) or with lazydag as a Meson subproject: it records a
// few ops through the engine and prints what they computed.
#include <lazydag/lazydag.hpp>

#include <cstdio>

int main() {
  using namespace lazydag;
  NDArray a = nd::arange(0, 10, 1, DType::kFloat32, cpu());  // 0..9
  NDArray s = (a * 2.0 + 1.0).sum();                        // 2 * 45 + 10
  std::printf("consumer: sum=%g engine=%s\n", static_cast<double>(s.item<float>()),
              std::string(engine::to_string(nd::engine().policy())).c_str());
  return s.item<float>() == 100.0F ? 0 : 1;
}
