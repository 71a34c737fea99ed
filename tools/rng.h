// Deterministic random numbers for the demo, identical on every platform and thread count.
//
// std::uniform_int_distribution and std::shuffle are implementation-defined (libstdc++ and libc++
// give different sequences), so the demo draws its own: SplitMix64 as the generator, keyed by a
// hash of (seed, what, where) so any row or chunk of data can be produced independently.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>

namespace msa::cli {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A key for one independent stream, e.g. stream_key(seed, {kTagSelect, token, head}).
inline uint64_t stream_key(uint64_t seed, std::initializer_list<uint64_t> parts) {
  uint64_t h = splitmix64(seed);
  for (uint64_t p : parts) h = splitmix64(h ^ p);
  return h;
}

class Rng {
 public:
  explicit Rng(uint64_t key) : state_(key) {}
  uint64_t next() { return splitmix64(state_++); }
  // Uniform in [0, n), n >= 1. The modulo bias is below n / 2^64, far below anything the demo sees.
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
  template <typename T>
  void shuffle(T* a, int64_t n) {  // Fisher-Yates
    for (int64_t i = n - 1; i > 0; --i) std::swap(a[i], a[below(i + 1)]);
  }

 private:
  uint64_t state_;
};

}  // namespace msa::cli
