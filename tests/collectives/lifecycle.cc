#include "collectives/lifecycle.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>

#include "harness/harness.h"
#ifdef TUTTI_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tutti::test {
namespace {

const char* name(StepKind k) {
  static const char* kNames[] = {"parent all-reduce", "split", "child all-reduce", "destroy child",
                                 "abort child"};
  return kNames[int(k)];
}

// Parent rank r's colour (-1: NCCL_SPLIT_NOCOLOR) and key in a split.
int colourOf(const LifecycleStep& s, int r, int n) {
  switch (s.colouring) {
    case Colouring::kParity:
      return r % 2;
    case Colouring::kHalves:
      return r < n / 2 ? 0 : 1;
    case Colouring::kSame:
      return 0;
    case Colouring::kLeaveOut:
      return r == s.leftOut ? NCCL_SPLIT_NOCOLOR : 0;
  }
  return 0;
}
int keyOf(const LifecycleStep& s, int r) { return s.reverseKeys ? -r : r; }

// The parent ranks of r's child in the child's rank order (empty: r has no colour).
std::vector<int> membersWith(const LifecycleStep& s, int r, int n) {
  std::vector<int> m;
  const int c = colourOf(s, r, n);
  if (c == NCCL_SPLIT_NOCOLOR) return m;
  for (int q = 0; q < n; ++q)
    if (colourOf(s, q, n) == c) m.push_back(q);
  std::stable_sort(m.begin(), m.end(), [&](int a, int b) { return keyOf(s, a) < keyOf(s, b); });
  return m;
}

struct Child {
  int split;  // its split's step
  bool live;
};

#ifdef TUTTI_HAVE_CUDA
// The all-reduce on GPU buffers, in place, through pinned memory: "" or what failed.
std::string deviceAllReduce(const LifecycleDevice& d, ncclComm_t c, float* host, size_t count) {
  auto s = static_cast<cudaStream_t>(d.stream);
  memcpy(d.pinned, host, count * sizeof(float));
  if (cudaMemcpyAsync(d.device, d.pinned, count * sizeof(float), cudaMemcpyHostToDevice, s) !=
      cudaSuccess)
    return "cudaMemcpyAsync";
  if (ncclAllReduce(d.device, d.device, count, ncclFloat, ncclSum, c, s) != ncclSuccess)
    return "ncclAllReduce";
  if (cudaMemcpyAsync(d.pinned, d.device, count * sizeof(float), cudaMemcpyDeviceToHost, s) !=
          cudaSuccess ||
      cudaStreamSynchronize(s) != cudaSuccess)
    return "reading the result back";
  memcpy(host, d.pinned, count * sizeof(float));
  return "";
}
#else
std::string deviceAllReduce(const LifecycleDevice&, ncclComm_t, float*, size_t) {
  return "this build has no CUDA";
}
#endif

}  // namespace

std::vector<LifecycleStep> randomLifecycle(int n, uint32_t seed, int length) {
  std::mt19937 rng(seed);
  auto pick = [&](size_t k) { return size_t(rng() % k); };
  const size_t counts[] = {1, 1000, kLifecycleMaxCount};
  std::vector<LifecycleStep> steps;
  std::vector<Child> children;
  auto liveChild = [&]() -> int {
    std::vector<int> live;
    for (size_t i = 0; i < children.size(); ++i)
      if (children[i].live) live.push_back(int(i));
    return live.empty() ? -1 : live[pick(live.size())];
  };
  for (int i = 0; i < length; ++i) {
    LifecycleStep s;
    const size_t k = pick(10);
    const int child = liveChild();
    size_t liveCount = 0;
    for (const Child& c : children) liveCount += c.live;
    if (k < 3 || (k >= 5 && child < 0)) {
      s.kind = StepKind::kParentAllReduce;
      s.count = counts[pick(3)];
    } else if (k < 5 && liveCount < 4) {
      s.kind = StepKind::kSplit;
      s.colouring = static_cast<Colouring>(pick(4));
      s.leftOut = int(pick(size_t(n)));
      s.reverseKeys = pick(2) == 1;
      s.mode = static_cast<SplitMode>(pick(3));
      s.child = int(children.size());
      children.push_back({i, true});
      // Now and then every rank aborts the child at once, before its split may have run.
      if (s.mode == SplitMode::kNonblocking && pick(3) == 0) {
        steps.push_back(s);
        LifecycleStep a;
        a.kind = StepKind::kAbortChild;
        a.child = s.child;
        children.back().live = false;
        steps.push_back(a);
        continue;
      }
    } else if (k < 8 && child >= 0) {
      s.kind = StepKind::kChildAllReduce;
      s.count = counts[pick(3)];
      s.child = child;
    } else if (child >= 0) {
      s.kind = pick(3) == 0 ? StepKind::kAbortChild : StepKind::kDestroyChild;
      s.child = child;
      children[size_t(child)].live = false;
    } else {
      s.kind = StepKind::kParentAllReduce;
      s.count = counts[pick(3)];
    }
    steps.push_back(s);
  }
  return steps;
}

std::string describeLifecycle(const std::vector<LifecycleStep>& steps) {
  std::ostringstream os;
  for (size_t i = 0; i < steps.size(); ++i) {
    const LifecycleStep& s = steps[i];
    os << "#" << i << ": " << name(s.kind);
    if (s.count) os << " of " << s.count;
    if (s.child >= 0) os << ", child " << s.child;
    if (s.kind == StepKind::kSplit) {
      static const char* kCol[] = {"parity", "halves", "same", "leave out"};
      static const char* kMode[] = {"blocking", "non-blocking", "in a group"};
      os << " by " << kCol[int(s.colouring)];
      if (s.colouring == Colouring::kLeaveOut) os << " " << s.leftOut;
      os << (s.reverseKeys ? ", keys reversed" : "") << ", " << kMode[int(s.mode)];
    }
    os << "\n";
  }
  return os.str();
}

// One rank's run of the program; "" or what went wrong first.
std::string runLifecycle(ncclComm_t parent, int r, int n, const std::vector<LifecycleStep>& steps,
                         const std::function<void()>& barrier, const LifecycleDevice* dev) {
  struct Held {
    ncclComm_t comm = nullptr;
    std::vector<int> members;  // parent ranks, in the child's rank order
    bool checked = false;      // rank and size checked (a non-blocking one once it is ready)
  };
  std::vector<Held> children;
  std::vector<int> splitOf;  // child index -> its split step
  auto fail = [&](size_t i, const std::string& what, ncclComm_t c) {
    return "rank " + std::to_string(r) + ", step " + std::to_string(i) + " (" +
           name(steps[i].kind) + "): " + what + (c ? std::string(": ") + ncclGetLastError(c) : "");
  };
  auto allReduce = [&](ncclComm_t c, const std::vector<int>& members, size_t count,
                       size_t i) -> std::string {
    // Each member gives parent rank + 1 + 10 i: the sum is exact in float.
    std::vector<float> buf(count, float(r + 1 + 10 * int(i)));
    if (!dev) {
      if (ncclAllReduce(buf.data(), buf.data(), count, ncclFloat, ncclSum, c, nullptr) !=
          ncclSuccess)
        return fail(i, "ncclAllReduce", c);
    } else {
      std::string e = deviceAllReduce(*dev, c, buf.data(), count);
      if (!e.empty()) return fail(i, e, e == "ncclAllReduce" ? c : nullptr);
    }
    float want = 0;
    for (int q : members) want += float(q + 1 + 10 * int(i));
    for (size_t j = 0; j < count; j += 997) {
      if (buf[j] != want)
        return fail(i,
                    "element " + std::to_string(j) + " is " + std::to_string(buf[j]) +
                        ", expected " + std::to_string(want),
                    nullptr);
    }
    return "";
  };
  // Waits for a non-blocking child and checks its rank and size, once.
  auto ready = [&](Held& h, size_t i) -> std::string {
    if (h.checked) return "";
    if (ncclResult_t st = waitInitialized(h.comm, 20); st != ncclSuccess)
      return fail(i, "the child of step " + std::to_string(i) + " did not form", h.comm);
    int rank = -1, size = 0;
    ncclCommUserRank(h.comm, &rank);
    ncclCommCount(h.comm, &size);
    const int want = int(std::find(h.members.begin(), h.members.end(), r) - h.members.begin());
    if (rank != want || size != int(h.members.size()))
      return fail(i,
                  "child rank " + std::to_string(rank) + " of " + std::to_string(size) +
                      ", expected " + std::to_string(want) + " of " +
                      std::to_string(h.members.size()),
                  nullptr);
    h.checked = true;
    return "";
  };
  std::vector<int> everyone(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) everyone[size_t(q)] = q;
  std::string err;
  const bool trace = getenv("TUTTI_LIFECYCLE_TRACE") != nullptr;
  const double t0 = now();
  for (size_t i = 0; i < steps.size() && err.empty(); ++i) {
    const LifecycleStep& s = steps[i];
    if (trace)
      fprintf(stderr, "lifecycle: rank %d step %zu (%s) at %.3f s\n", r, i, name(s.kind),
              now() - t0);
    switch (s.kind) {
      case StepKind::kParentAllReduce:
        err = allReduce(parent, everyone, s.count, i);
        break;
      case StepKind::kSplit: {
        Held h;
        h.members = membersWith(s, r, n);
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = s.mode == SplitMode::kNonblocking ? 0 : 1;
        const int colour = colourOf(s, r, n);
        if (s.mode == SplitMode::kInGroup) ncclGroupStart();
        ncclResult_t rc = ncclCommSplit(parent, colour, keyOf(s, r), &h.comm, &cfg);
        if (s.mode == SplitMode::kInGroup) {
          const ncclResult_t end = ncclGroupEnd();
          if (rc == ncclSuccess) rc = end;
        }
        if (rc != ncclSuccess && rc != ncclInProgress) {
          err = fail(i, "ncclCommSplit", parent);
          break;
        }
        if (colour == NCCL_SPLIT_NOCOLOR && h.comm != nullptr)
          err = fail(i, "a rank of no colour got a communicator", nullptr);
        if (colour == NCCL_SPLIT_NOCOLOR) h.checked = true;
        if (s.mode != SplitMode::kNonblocking && h.comm) err = ready(h, i);
        children.push_back(h);
        break;
      }
      case StepKind::kChildAllReduce: {
        Held& h = children[size_t(s.child)];
        if (!h.comm) break;  // no colour: the others run it
        err = ready(h, i);
        if (err.empty()) err = allReduce(h.comm, h.members, s.count, i);
        break;
      }
      case StepKind::kDestroyChild: {
        Held& h = children[size_t(s.child)];
        barrier();  // every member is done with it (ranks of no colour meet here too)
        if (!h.comm) break;
        err = ready(h, i);
        if (err.empty() && ncclCommDestroy(h.comm) != ncclSuccess)
          err = fail(i, "ncclCommDestroy", nullptr);
        h.comm = nullptr;
        break;
      }
      case StepKind::kAbortChild: {
        Held& h = children[size_t(s.child)];
        barrier();  // no member is inside an operation on it
        if (!h.comm) break;
        const double start = now();
        if (ncclCommAbort(h.comm) != ncclSuccess) err = fail(i, "ncclCommAbort", nullptr);
        if (err.empty() && secondsSince(start) > 2.0)
          err =
              fail(i, "ncclCommAbort took " + std::to_string(secondsSince(start)) + " s", nullptr);
        h.comm = nullptr;
        break;
      }
    }
  }
  for (Held& h : children) {
    if (h.comm) ncclCommAbort(h.comm);  // after a failure
  }
  return err;
}

}  // namespace tutti::test
