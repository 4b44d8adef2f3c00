// The NDArray example from the docs: record, wait, read, print, and a
// device no-op. Compiled and run by the build.
#include <lazydag/lazydag.hpp>

#include <iostream>

using namespace lazydag;

int main() {
  auto x = nd::random_uniform({1000, 1000}, cpu(), /*seed=*/1);
  auto y = nd::dot(x, x);            // recorded, returns at once
  y.wait_to_read();                  // runs only what y needs
  float s = y.sum().item<float>();   // implicit blocker
  std::vector<float> h = y.to_vector<float>();
  std::cout << y.slice(0, 0, 2) << '\n';
  auto w = x.as_in_device(cpu());    // same array: no copy, nothing recorded
  nd::waitall();
  std::cout << "sum = " << s << ", elements = " << h.size()
            << ", as_in_device shares storage: " << std::boolalpha << w.shares_storage_with(x) << '\n';
  // x is uniform in [0, 1): each entry of x.x is a sum of 1000 products with mean 1/4.
  return s > 2.4e8F && s < 2.6e8F && w.shares_storage_with(x) ? 0 : 1;
}
