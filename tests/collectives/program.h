// Programs: seeded random lists of cases of the correctness matrix that a rank queues back to
// back on GPU buffers -- some in groups, on two streams, or captured into a CUDA graph --
// without waiting between them, then checks every result (tests/gpu/gpu_program_test.cc, and
// tutti_test_rank's program-device for ranks as processes). The matrix runs one case at a time;
// a program tests what one operation leaves to the next: FIFO positions across protocols and
// algorithms, the order of launches on different streams, groups packing several operations
// into one launch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "collectives/matrix.h"

namespace tutti::test {

struct ProgramStep {
  Case c;
  int group;   // steps with the same group id >= 0 are queued in one ncclGroupStart/End
  int stream;  // 0 or 1: which of the rank's two streams
  bool host;   // pageable host buffers (the CPU engine, after the stream's earlier work)
};

// The same program on every rank for the same arguments: `length` steps, every collective kind,
// counts from 0 to past the FIFO (NCCL_BUFFSIZE = fifoBytes) and the small counts of LL and of
// the gathered all-reduce, every dtype and op, in- and out-of-place, every root. Each case's
// salt is distinct, so no two steps have the same inputs. hostSteps: about one step in five
// on pageable host buffers (not in a graph: a capturing stream refuses them).
std::vector<ProgramStep> randomProgram(int nranks, size_t fifoBytes, uint32_t seed, int length,
                                       bool hostSteps = false);

// One line per step ("#i: <case>, stream s, group g, host").
std::string describeProgram(const std::vector<ProgramStep>& program);

// A rank a thread drives, and its two streams (cudaStream_t; the same twice where one stream is
// wanted; ranks may share streams too).
struct ProgramRank {
  ncclComm_t comm;
  int rank;
  void* streams[2];
};

struct ProgramRun {
  // The ranks this thread drives: one (ranks as threads or processes), or several
  // (ncclCommInitAll), whose steps it queues in one group across them.
  std::vector<ProgramRank> ranks;
  int nranks;  // the communicator's size
  bool graph;  // capture every step into one graph (forking every other stream from the first
               // rank's first stream) and launch it once
  // Called once every step's buffers are ready and before the first is queued (ranks on
  // threads wait for each other there: no rank allocates while another's kernel waits for it).
  std::function<void()> ready;
};

// Prepares every step of every rank (the thread's arena reserved for all of them), queues them
// all, then checks each: the failures, at most maxReport, each naming its step. The caller
// releases the arena (releaseDeviceMemory) once no kernel may still use it.
std::vector<std::string> runProgram(const ProgramRun& run, const std::vector<ProgramStep>& program,
                                    size_t maxReport = 10);

}  // namespace tutti::test
