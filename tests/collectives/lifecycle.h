// Lifecycle programs: every rank runs the same seeded random list of communicator calls --
// all-reduces on the parent, splits of it (blocking, non-blocking, inside a group; by parity,
// by halves, all alike, one rank of no colour; keys reversed or not), all-reduces on the
// children, children destroyed, children aborted by every rank (some right after a non-blocking
// split, before it may have run) -- checking every result and every child's rank and size
// (tests/comm/lifecycle_test.cc on host buffers; tests/gpu on GPU buffers, ranks as threads and
// as processes). A parent's splits share its bootstrap ring with each other and with its first
// GPU collective; the order of such calls is where faults hid (docs/gpu-results.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nccl.h"

namespace tutti::test {

enum class StepKind { kParentAllReduce, kSplit, kChildAllReduce, kDestroyChild, kAbortChild };
enum class Colouring { kParity, kHalves, kSame, kLeaveOut };
enum class SplitMode { kBlocking, kNonblocking, kInGroup };

struct LifecycleStep {
  StepKind kind;
  size_t count = 0;  // all-reduces (floats)
  int child = -1;    // the child a step uses (numbered by the splits that made them)
  Colouring colouring = Colouring::kSame;
  int leftOut = 0;  // kLeaveOut: the parent rank of no colour
  bool reverseKeys = false;
  SplitMode mode = SplitMode::kBlocking;
};

constexpr size_t kLifecycleMaxCount = 70000;

std::vector<LifecycleStep> randomLifecycle(int nranks, uint32_t seed, int length);
// One line per step.
std::string describeLifecycle(const std::vector<LifecycleStep>& steps);

// GPU buffers for the all-reduces (kLifecycleMaxCount floats each, made before the program:
// cudaMalloc may wait for the whole GPU while a sibling's kernel waits for this thread), moved
// through pinned memory on `stream`.
struct LifecycleDevice {
  float* device;
  float* pinned;
  void* stream;  // cudaStream_t
};

// Runs the program on one rank: "" or what went wrong first. barrier: every rank meets there
// before a child is destroyed or aborted (no member is inside an operation on it). dev: GPU
// buffers, or null for host buffers.
std::string runLifecycle(ncclComm_t parent, int rank, int nranks,
                         const std::vector<LifecycleStep>& steps,
                         const std::function<void()>& barrier,
                         const LifecycleDevice* dev = nullptr);

}  // namespace tutti::test
