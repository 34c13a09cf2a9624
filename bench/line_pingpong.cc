// tutti-line-pingpong: what moving one cache line between two CPUs costs right now, as a round
// trip in ns. Two threads, pinned to the two CPUs, take turns writing one 64-byte line. On a
// VM the answer can change from one minute to the next (a hypervisor that moves vCPUs between
// dies: 54-88 ns within one die, 330-360 ns between two, docs/host-results.md), and with it
// every shared-memory hand-over; bench/compare/compare records it before each run.
//
//   tutti-line-pingpong [-a CPU] [-b CPU] [-n ROUNDTRIPS]
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace {

struct alignas(64) Line {
  std::atomic<long> v{0};
};

bool pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  return pthread_setaffinity_np(pthread_self(), sizeof(s), &s) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  int a = -1, b = -1;
  long n = 200000;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "-a") && i + 1 < argc) {
      a = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "-b") && i + 1 < argc) {
      b = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "-n") && i + 1 < argc) {
      n = atol(argv[++i]);
    } else {
      fprintf(stderr, "usage: tutti-line-pingpong [-a CPU] [-b CPU] [-n ROUNDTRIPS]\n");
      return 2;
    }
  }
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
    perror("tutti-line-pingpong: sched_getaffinity");
    return 1;
  }
  for (int c = 0; c < CPU_SETSIZE && (a < 0 || b < 0); ++c) {  // default: the first two allowed
    if (!CPU_ISSET(c, &allowed) || c == a || c == b) continue;
    (a < 0 ? a : b) = c;
  }
  if (a < 0 || b < 0 || a == b || n <= 0) {
    fprintf(stderr, "tutti-line-pingpong: needs two distinct CPUs (allowed: %d)\n",
            CPU_COUNT(&allowed));
    return 1;
  }
  Line line;
  bool pinnedB = true;
  std::thread other([&] {
    pinnedB = pin(b);
    for (long i = 0; i < n; ++i) {
      while (line.v.load(std::memory_order_acquire) != 2 * i + 1) {
      }
      line.v.store(2 * i + 2, std::memory_order_release);
    }
  });
  if (!pin(a)) {
    fprintf(stderr, "tutti-line-pingpong: cannot run on CPU %d\n", a);
    _Exit(1);  // the other thread waits for a line that never comes
  }
  auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) {
    line.v.store(2 * i + 1, std::memory_order_release);
    while (line.v.load(std::memory_order_acquire) != 2 * i + 2) {
    }
  }
  double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  other.join();
  if (!pinnedB) {
    fprintf(stderr, "tutti-line-pingpong: cannot run on CPU %d\n", b);
    return 1;
  }
  printf("line round trip CPU %d <-> CPU %d: %.0f ns (%ld round trips)\n", a, b, ns / double(n), n);
  return 0;
}
