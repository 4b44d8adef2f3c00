// Devices: arrays on the emulated stream device sim(0) and sim(1) (a GPU's
// streams and events, on any machine), explicit copies, a refused mix, and
// gpu(0) where it can be used.
#include <lazydag/lazydag.hpp>

#include <iostream>

using namespace lazydag;

int main() {
  NDArray host = nd::random_uniform({256, 256}, cpu(), 1);

  // Two independent chains on two devices overlap by themselves.
  NDArray a = host.copyto(sim(0));
  NDArray b = host.copyto(sim(1));
  for (int i = 0; i < 4; ++i) {
    a = nd::tanh(nd::matmul(a, a) * 0.01);
    b = nd::tanh(nd::matmul(b, b) * 0.01);
  }

  // Data never moves implicitly.
  try {
    (void)(a + b);
  } catch (const DeviceMismatch& e) {
    std::cout << "refused: " << e.what() << '\n';
  }
  NDArray sum = a + b.copyto(sim(0));     // an explicit peer copy
  NDArray same = sum.as_in_device(sim(0));  // already there: no copy
  std::cout << "as_in_device shares storage: " << same.shares_storage_with(sum) << '\n';

  // One blocker, one transfer to the host.
  std::cout << "sum = " << sum.sum().item<float>() << '\n';

  try {
    NDArray g = host.copyto(gpu(0));
    std::cout << "on gpu(0): " << nd::matmul(g, g).sum().item<float>() << '\n';
  } catch (const BackendUnavailable& e) {
    std::cout << "no GPU here: " << e.what() << '\n';
  }
  return 0;
}
