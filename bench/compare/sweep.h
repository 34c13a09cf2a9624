// Shared by the peer drivers of the comparison harness: the size sweep, the nccl-tests bus
// bandwidth factors, and the one CSV line format the harness reads back.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace compare {

struct Sweep {
  std::string coll = "all_reduce";  // all_reduce | all_gather | broadcast
  size_t minBytes = 8, maxBytes = 64 << 20;
  double factor = 4;
  int iters = 20, warmup = 5;
  std::string algo;  // driver-specific variant (gloo: ring, halving_doubling, bcube)
};

inline size_t parseBytes(const char* s) {
  char* end = nullptr;
  double v = strtod(s, &end);
  if (*end == 'K' || *end == 'k') v *= 1024;
  if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
  if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024;
  return size_t(v);
}

inline Sweep parseSweep(int argc, char** argv) {
  Sweep s;
  if (argc > 1) s.coll = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string f = argv[i];
    const char* v = argv[i + 1];
    if (f == "-b")
      s.minBytes = parseBytes(v);
    else if (f == "-e")
      s.maxBytes = parseBytes(v);
    else if (f == "-f")
      s.factor = atof(v);
    else if (f == "-n")
      s.iters = atoi(v);
    else if (f == "-w")
      s.warmup = atoi(v);
    else if (f == "-a")
      s.algo = v;
    else {
      fprintf(stderr, "unknown flag %s\n", f.c_str());
      exit(2);
    }
  }
  if (s.coll != "all_reduce" && s.coll != "all_gather" && s.coll != "broadcast") {
    fprintf(stderr, "collective must be all_reduce, all_gather or broadcast\n");
    exit(2);
  }
  return s;
}

// Sizes as tutti-perf and nccl-tests step them: total bytes of the (largest) buffer.
inline std::vector<size_t> sizes(const Sweep& s) {
  std::vector<size_t> out;
  for (size_t b = s.minBytes; b <= s.maxBytes; b = std::max(b + 1, size_t(double(b) * s.factor))) {
    out.push_back(b);
    if (s.factor <= 1) break;
  }
  return out;
}

inline double busFactor(const std::string& coll, int n) {
  if (coll == "all_reduce") return 2.0 * (n - 1) / n;
  if (coll == "all_gather") return double(n - 1) / n;
  return 1.0;
}

inline double nowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// lib,coll,bytes,time_us,busbw_GBps -- the harness reads these lines.
inline void report(const char* lib, const Sweep& s, size_t bytes, double seconds, int n) {
  double algbw = seconds > 0 ? double(bytes) / seconds / 1e9 : 0;
  printf("CSV,%s,%s,%zu,%.3f,%.4f\n", lib, s.coll.c_str(), bytes, seconds * 1e6,
         algbw * busFactor(s.coll, n));
  fflush(stdout);
}

}  // namespace compare
