// A move-only callable with inline storage: the body of a recorded node,
// stored without a heap allocation when its captures fit in 120 bytes.
#pragma once

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>

namespace lazydag::engine {

struct RunContext;

/// Type-erased `void(const RunContext&)`, move-only (captures may be
/// move-only), small-buffer optimised. Not thread-safe; owned by one node.
class Function {
 public:
  static constexpr std::size_t kInlineBytes = 120;

  Function() noexcept = default;
  Function(std::nullptr_t) noexcept {}  // NOLINT: implicit like std::function

  template <class F, class D = std::decay_t<F>,
            class = std::enable_if_t<!std::is_same_v<D, Function> &&
                                     std::is_invocable_v<D&, const RunContext&>>>
  Function(F&& f) {  // NOLINT: implicit conversion from any callable is the point
    if constexpr (std::is_constructible_v<bool, const D&>) {
      // an empty std::function or null function pointer stays empty
      if (!static_cast<bool>(static_cast<const D&>(f))) return;
    }
    if constexpr (fits_inline<D>()) {
      ::new (static_cast<void*>(buf_)) D(std::forward<F>(f));
      vtable_ = &kInlineTable<D>;
    } else {
      ::new (static_cast<void*>(buf_)) D*(new D(std::forward<F>(f)));
      vtable_ = &kHeapTable<D>;
    }
  }

  Function(Function&& o) noexcept { move_from(o); }
  Function& operator=(Function&& o) noexcept {
    if (this != &o) {
      reset();
      move_from(o);
    }
    return *this;
  }
  Function(const Function&) = delete;
  Function& operator=(const Function&) = delete;
  ~Function() { reset(); }

  /// Runs the callable; undefined when empty (check with operator bool).
  void operator()(const RunContext& ctx) { vtable_->invoke(buf_, ctx); }
  explicit operator bool() const noexcept { return vtable_ != nullptr; }

  /// True when destroying it runs no code: empty, or stored inline with
  /// trivially destructible captures (pointers, numbers).
  [[nodiscard]] bool trivially_destructible() const noexcept { return vtable_ == nullptr || vtable_->trivial; }

  /// Destroys the callable (and its captures) now.
  void reset() noexcept {
    if (vtable_ != nullptr) {
      vtable_->destroy(buf_);
      vtable_ = nullptr;
    }
  }

 private:
  struct VTable {
    void (*invoke)(void*, const RunContext&);
    void (*move)(void* dst, void* src) noexcept;  // move-construct dst, destroy src
    void (*destroy)(void*) noexcept;
    bool trivial;  // destroy does nothing
  };

  template <class D>
  static constexpr bool fits_inline() {
    return sizeof(D) <= kInlineBytes && alignof(D) <= alignof(std::max_align_t) &&
           std::is_nothrow_move_constructible_v<D>;
  }

  template <class D>
  static constexpr VTable kInlineTable{
      [](void* p, const RunContext& c) { (*std::launder(static_cast<D*>(p)))(c); },
      [](void* dst, void* src) noexcept {
        D* s = std::launder(static_cast<D*>(src));
        ::new (dst) D(std::move(*s));
        s->~D();
      },
      [](void* p) noexcept { std::launder(static_cast<D*>(p))->~D(); },
      std::is_trivially_destructible_v<D>};

  template <class D>
  static constexpr VTable kHeapTable{
      [](void* p, const RunContext& c) { (**static_cast<D**>(p))(c); },
      [](void* dst, void* src) noexcept { ::new (dst) D*(*static_cast<D**>(src)); },
      [](void* p) noexcept { delete *static_cast<D**>(p); },
      false};

  void move_from(Function& o) noexcept {
    if (o.vtable_ != nullptr) {
      o.vtable_->move(buf_, o.buf_);
      vtable_ = o.vtable_;
      o.vtable_ = nullptr;
    }
  }

  alignas(std::max_align_t) unsigned char buf_[kInlineBytes];
  const VTable* vtable_ = nullptr;
};

}  // namespace lazydag::engine
