// Picks between two ways of running an operation by timing them on the machine as it is now.
// Some choices flip with the machine's state (a VM whose vCPUs move between dies; docs/host-
// results.md): two ranks all-gathering over shm, medians of 22-30 runs with a cache line's round
// trip under 150 ns, us, by address / through the slots / Open MPI: 1 MiB 69 / 48 / 67; 16 MiB
// 2371 / 2075 / 2652; with it over 250 ns (2-7 runs): 256 KiB 19 / 61 / 27; 16 MiB 2304 / 3920 /
// 2284. So each rank times its own runs of each way, per size class, and takes the way
// whose recent runs were faster, giving the other one run in kExplore (kExploreFar) so that a
// change shows.
// Each way's first run does not count (it pays for first touches of pages and slots).
#pragma once

#include <algorithm>
#include <cstdint>

namespace tutti {

class TwoWayTuner {
 public:
  static constexpr int kKeep = 4;              // the last runs kept per way and size class
  static constexpr double kMargin = 0.9;       // how much faster the other way must be to take over
  static constexpr uint32_t kExplore = 16;     // one run in this many takes the other way,
  static constexpr uint32_t kExploreFar = 64;  // or in this many where it is far behind
  static constexpr double kFarBehind = 1.25;
  static constexpr int kBuckets = 64;  // size classes: log2 of the bytes

  static int bucketOf(uint64_t bytes) {
    int b = 0;
    while (bytes > 1 && b < kBuckets - 1) {
      bytes >>= 1;
      ++b;
    }
    return b;
  }

  // The way (0 or 1) the next run of this size class takes. Until each way has two runs that
  // count, they alternate (way 0 first).
  int pick(int bucket) {
    Bucket& b = buckets_[std::clamp(bucket, 0, kBuckets - 1)];
    ++b.runs;
    if (b.way[0].counted() < 2 || b.way[1].counted() < 2) {
      return b.way[1].seen < b.way[0].seen ? 1 : 0;
    }
    b.best = lean(b);
    // Far behind (kFarBehind), the other way is tried more rarely: each try costs more.
    const bool far = b.way[1 - b.best].typical() > kFarBehind * b.way[b.best].typical();
    return b.runs % (far ? kExploreFar : kExplore) == 0 ? 1 - b.best : b.best;
  }

  // A run of `way` in this size class took `ns`.
  void record(int bucket, int way, double ns) {
    Way& w = buckets_[std::clamp(bucket, 0, kBuckets - 1)].way[way & 1];
    if (w.seen++ == 0) return;  // first touches
    w.t[w.n % kKeep] = ns;
    ++w.n;
  }

  // The way this size class would take without exploring, -1 while it is still alternating.
  int leaning(int bucket) const {
    const Bucket& b = buckets_[std::clamp(bucket, 0, kBuckets - 1)];
    if (b.way[0].counted() < 2 || b.way[1].counted() < 2) return -1;
    return lean(b);
  }
  // The leaning, where it differs from the one this last returned for the size class (a trace
  // line for each change); -1 otherwise.
  int newLeaning(int bucket) {
    Bucket& b = buckets_[std::clamp(bucket, 0, kBuckets - 1)];
    const int now = leaning(bucket);
    if (now < 0 || now == b.told) return -1;
    b.told = now;
    return now;
  }
  // The fastest kept run of `way` in this size class, ns (0 while none counts).
  double fastest(int bucket, int way) const {
    const Way& w = buckets_[std::clamp(bucket, 0, kBuckets - 1)].way[way & 1];
    return w.counted() ? w.typical() : 0;
  }

 private:
  struct Way {
    double t[kKeep] = {};
    uint32_t n = 0;     // runs kept so far (the last kKeep are in t)
    uint32_t seen = 0;  // runs recorded, the first included
    int counted() const { return int(std::min<uint32_t>(n, kKeep)); }
    // The fastest of the kept runs: a run's time also holds what the peer kept it waiting (it
    // came late, it was preempted), which only ever adds.
    double typical() const { return *std::min_element(t, t + counted()); }
  };
  struct Bucket {
    Way way[2];
    uint32_t runs = 0;
    int best = 0;   // the way taken when not exploring
    int told = -1;  // the leaning newLeaning last returned
  };
  // The other way takes over only when clearly faster (by kMargin), so that two about as fast
  // do not flip back and forth on noise.
  static int lean(const Bucket& b) {
    const int other = 1 - b.best;
    return b.way[other].typical() < kMargin * b.way[b.best].typical() ? other : b.best;
  }
  Bucket buckets_[kBuckets];
};

}  // namespace tutti
