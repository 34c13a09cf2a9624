// The correctness matrix of DESIGN.md: every collective over counts {0, 1, odd, larger than
// the FIFO, not divisible by nranks}, every datatype and op, in- and out-of-place, every
// root. Each rank runs the same list of cases and checks its own output against an oracle
// computed here from every rank's input (exact for integers; in double for floats, with
// inputs chosen so that sums, products and extremes are exact in every float format, so only
// ncclAvg needs a tolerance: fp8's final division, and for the other floats the inputs
// scaled by 1/nranks in the type and summed, as NCCL). Output buffers are poisoned before
// every call, so a result that was never written cannot pass.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nccl.h"

namespace tutti::test {

enum class TestColl {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kAlltoAll,
  kGather,
  kScatter,
  kSendRecv
};
constexpr int kNumTestColls = 9;
// Ops beyond the built-in five: ncclRedOpCreatePreMulSum with a host or a device scalar.
constexpr int kPreMulHost = 100;
constexpr int kPreMulDevice = 101;

struct Case {
  TestColl coll;
  int dtype;
  int op;  // ncclRedOp_t, kPreMulHost, kPreMulDevice; ignored by non-reductions
  size_t count;
  bool inPlace;
  int root;
  uint32_t salt = 0;  // mixed into every input: cases alike but for it have different inputs
  std::string name() const;
};

const char* collName(TestColl c);
// Counts to cover: 0, 1, odd, bigger than the FIFO (NCCL_BUFFSIZE bytes of int8), and one not
// divisible by nranks.
std::vector<size_t> matrixCounts(size_t fifoBytes);
// A list that hits every value of every axis for nranks: every reduction with every dtype x
// op, every collective with every count and in-place mode, every root.
std::vector<Case> matrixCases(int nranks, size_t fifoBytes);

// Where a case's buffers live. kDevice: the same buffers, poisoned the same way, copied to
// GPU memory, run on `stream` (a cudaStream_t), and copied back to be checked.
enum class Memory { kHost, kDevice };

// Memory::kDevice: each rank thread first reserves GPU memory for the largest of its cases
// ("" or the error), and all rank threads of a process do so before any runs a case
// (cudaMalloc / cudaFree may wait for the whole GPU, where a kernel of another rank may be
// waiting for this one); releaseDeviceMemory once every rank is done.
std::string reserveDeviceMemory(const std::vector<Case>& cases, int nranks);
// The same for `bytes` (the sum of caseDeviceBytes of the cases a thread holds at once).
std::string reserveDeviceMemory(size_t bytes);
void releaseDeviceMemory();
// The GPU memory a case takes in the thread's arena (Memory::kDevice).
size_t caseDeviceBytes(const Case& c, int nranks);

// Runs one case on this rank; "" when the output is right, else what is wrong.
std::string runCase(ncclComm_t comm, int rank, int nranks, const Case& c,
                    Memory mem = Memory::kHost, void* stream = nullptr);
// The same with `call` doing the operation on this rank's buffers, laid out as runCase lays
// them out (a test engine of its own: tests/emu). scalar: the PreMulSum scalar as one element
// of the case's datatype. Returns "" or what went wrong.
using CallFn = std::function<std::string(const void* send, void* recv, const uint8_t* scalar)>;
std::string runCaseWith(int rank, int nranks, const Case& c, const CallFn& call);
// Whether a case's op is ncclRedOpCreatePreMulSum's (kPreMulHost / kPreMulDevice).
inline bool isPreMul(int op) { return op == kPreMulHost || op == kPreMulDevice; }

// One case on one rank in three steps, for tests that queue several operations before they
// check any (tests/gpu/gpu_program_test.cc); runCase is the three in a row.
class CaseRun {
 public:
  CaseRun(int rank, int nranks, const Case& c);
  ~CaseRun();  // destroys the case's PreMulSum op
  CaseRun(const CaseRun&) = delete;
  CaseRun& operator=(const CaseRun&) = delete;
  // Fills the buffers (inputs, poisoned outputs) and makes the PreMulSum op on comm (null
  // comm: none). Memory::kDevice: copies them to the thread's arena at arenaOffset (cases held
  // at once lie caseDeviceBytes apart), in `stream`'s order. "" or what failed.
  std::string prepare(ncclComm_t comm, Memory mem, void* stream, size_t arenaOffset = 0);
  // The operation on comm, on `stream` (GPU buffers: a stream ordered after prepare's copies).
  ncclResult_t issue(ncclComm_t comm, void* stream);
  // The operation by the caller's own engine (runCaseWith): "" or what failed.
  std::string issueWith(const CallFn& call);
  // Memory::kDevice: copies the result back in `stream`'s order (after the operation) and
  // waits for it. Then "" when every output is right, else what is wrong.
  std::string check(void* stream);
  const Case& testCase() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Runs every case; the failures, at most `maxReport` of them.
std::vector<std::string> runCases(ncclComm_t comm, int rank, int nranks,
                                  const std::vector<Case>& cases, size_t maxReport = 10,
                                  Memory mem = Memory::kHost, void* stream = nullptr);

}  // namespace tutti::test
