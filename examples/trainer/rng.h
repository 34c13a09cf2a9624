// A small counter-based generator (SplitMix64 over seed, stream and counter), so the same seed
// gives the same initialisation and the same shuffles on every machine and standard library.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace trainer {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream) : state_(splitmix64(seed) ^ splitmix64(~stream)) {}
  uint64_t next() { return splitmix64(state_++); }
  // Uniform in [0, 1) with 24 bits, exactly representable as a float.
  float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f); }
  // Uniform in [0, n) without modulo bias.
  uint64_t below(uint64_t n) {
    uint64_t limit = ~uint64_t{0} - (~uint64_t{0} % n);
    uint64_t v;
    do v = next();
    while (v >= limit);
    return v % n;
  }

 private:
  uint64_t state_;
};

// The epoch's permutation of 0..n-1 (Fisher-Yates), as DistributedSampler's seed + epoch.
inline std::vector<int> epochPermutation(int n, uint64_t seed, int epoch) {
  std::vector<int> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[size_t(i)] = i;
  Rng rng(seed, 0x5eed0000ull + uint64_t(epoch));
  for (int i = n - 1; i > 0; --i) std::swap(p[size_t(i)], p[rng.below(uint64_t(i) + 1)]);
  return p;
}

}  // namespace trainer
