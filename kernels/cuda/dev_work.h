// What the host hands a device kernel: plain structs, the same bytes on both sides (this
// header is compiled by the host compiler and by nvcc). One launch carries up to kMaxOps
// operations of one communicator; a collective runs on blocks 0..nch-1 (block c = channel c),
// a point-to-point operation on the block the host gave it: one per (peer, direction), so that
// every send and receive of a group progresses at once whatever order the ranks issued them
// in, or, past what the GPU holds for each rank sharing it, several pairs to a block in an
// order every rank shares (devplan::plan).
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

// Callable from host and device code (nvcc); plain functions for the host compiler.
#if defined(__CUDACC__)
#define TUTTI_HD __host__ __device__
#else
#define TUTTI_HD
#endif

namespace tutti::dev {

constexpr int kMaxChannels = 16;
constexpr int kMaxOps = 16;
constexpr int kThreads = 512;  // threads per block: they share each slot's work
constexpr int kSteps = 8;      // slots per FIFO (transports/transport.h: kSlots)
// A Simple slot's size word: the byte count, and a flag on a message's last slot
// (transports/transport.h: kSizeMask, kLastSlot).
constexpr uint64_t kSizeMask = (1ull << 40) - 1;
constexpr uint64_t kLastSlot = 1ull << 62;

enum Proto : int32_t { kSimple = 0, kLL = 1 };

// How an AllReduce runs. kAlgoGather, for a message that fits one LL step: every rank's input
// goes round the ring (nranks - 1 steps, where the ring's reduce-scatter and all-gather take
// twice that) and each rank reduces the nranks values itself, in rank order, so that every
// rank computes the same expression and holds the same bits. The received lines stay in their
// slots until then: at most kSteps of them, so nranks <= kSteps + 1.
enum Algo : int32_t { kAlgoRing = 0, kAlgoGather = 1 };

// Same numbering as tutti::CollKind (runtime/coll_args.h).
enum Kind : int32_t {
  kAllReduce = 0,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kSend,
  kRecv
};

// One end of one FIFO as a kernel sees it. The counters follow transports/transport.h: the
// sender publishes tail = step + 1 once slot (step % kSteps) holds data (Simple) and the
// receiver head = step + 1 once it has consumed it. Each end reads its own counter at the
// start of a kernel to learn its step (only it writes that counter), so steps continue
// across operations and across graph replays with no host bookkeeping.
struct DevConn {
  uint64_t* tail = nullptr;  // in the receiver's memory
  uint64_t* head = nullptr;  // in the receiver's memory
  // Sender: its step, in memory of its own. Each kernel starts from it and advances it; LL
  // never waits for tail, so a last tail write there could land after the receiver freed the
  // FIFO. Receiver: unused (head is its step, in its own memory).
  uint64_t* step = nullptr;
  uint32_t* broken = nullptr;  // FifoCtrl::broken: set by a kernel that gives up, polled by waits
  uint64_t* sizes = nullptr;   // kSteps words: bytes in each Simple slot
  char* slots = nullptr;       // Simple: kSteps slots of slotBytes
  uint64_t slotBytes = 0;
  char* ll = nullptr;  // LL: kSteps slots of llSlotBytes of 16-byte lines
  uint64_t llSlotBytes = 0;
  int32_t peer = -1;
  // Both ends run on one GPU in one process, the FIFO in its memory: device-scope ordering
  // suffices (cheaper than system scope, which other GPUs, processes and host memory need).
  int32_t gpuScope = 0;
};

struct DevChannel {
  DevConn send;  // to the next rank of the ring
  DevConn recv;  // from the previous one
};

struct DevOp {
  int32_t kind = 0;
  int32_t root = 0;  // root; for send / recv the peer
  const void* send = nullptr;
  void* recv = nullptr;
  uint64_t count = 0;   // units the algorithm sees: elements, or bytes for copy-only ops
  uint64_t stride = 0;  // per-rank block in AllGather / ReduceScatter buffers
  uint64_t per = 0;     // each channel's share (a multiple of 64 units)
  uint64_t chunk = 0;   // most units one slot holds
  int32_t nch = 1;      // blocks (channels) of a collective
  int32_t block = 0;    // send / recv: the block that runs it
  int32_t proto = kSimple;
  int32_t hasPre = 0;         // PreMulSum: multiply the input by the scalar
  int32_t hasPost = 0;        // Avg: divide the result by nranks
  int32_t algo = 0;           // AllReduce: kAlgoRing, or kAlgoGather (LL, one channel, one step)
  uint8_t preScalar[8] = {};  // host-immediate scalar, one element of the dtype
  const void* preScalarPtr = nullptr;  // ncclScalarDevice: read when the kernel runs
  uint64_t seq = 0;                    // the communicator's op count, for error reports
  DevConn conn;                        // send / recv: the link to the peer
};

// Written by a kernel that gives up (abort, or no progress before the deadline), in host
// memory the host reads without synchronising: the first failure of a communicator wins.
enum ErrCode : uint32_t {
  kErrNone = 0,
  kErrAborted = 1,  // ncclCommAbort
  kErrTimeout = 2,  // no progress for TUTTI_TIMEOUT
  kErrSize = 3,     // the peer sent a slot of another size, or fewer / more slots
  kErrPeer = 4,     // a FIFO was marked broken: the peer's kernel gave up
};
struct DevError {
  uint32_t code;
  int32_t peer;
  int32_t channel;
  int32_t kind;
  uint64_t seq;
  uint64_t got;  // kErrSize: the bytes the peer sent
  uint64_t want;
};

// The words every block of a launch reads besides its operations: the head of DevWork and of
// DevArgs alike.
struct DevHeader {
  int32_t nops = 0;
  int32_t rank = 0;
  int32_t nranks = 1;
  int32_t nch = 0;  // ring channels the launch's collectives use (DevArgs holds that many)
  const volatile uint32_t* abortFlag = nullptr;  // mapped host memory: set by ncclCommAbort
  // The first failing thread claims errClaim (device memory, device-scope atomics), fills err
  // (mapped host memory) and publishes err->code last.
  uint32_t* errClaim = nullptr;
  DevError* err = nullptr;
  uint64_t timeoutNs = 0;  // one wait that long without progress fails
};

// A launch as the host plans it: room for every channel and operation.
struct DevWork : DevHeader {
  DevChannel ch[kMaxChannels];
  DevOp ops[kMaxOps];
};

// A launch as collKernel receives it: the header, then the nch channels, then the nops
// operations, packed, so that a launch passes only the bytes it uses (usedBytes: 392 for one
// operation on one channel, against 5.5 KB for all of DevWork). The driver copies a kernel's
// parameters into the launch's command stream at every eager launch; the bytes past usedBytes
// are never read (and not passed: they hold whatever the driver left there).
struct DevArgs : DevHeader {
  unsigned char data[kMaxChannels * sizeof(DevChannel) + kMaxOps * sizeof(DevOp)];

  TUTTI_HD const DevChannel& channel(int c) const {
    return reinterpret_cast<const DevChannel*>(data)[c];
  }
  TUTTI_HD const DevOp& op(int i) const {
    return reinterpret_cast<const DevOp*>(data + size_t(nch) * sizeof(DevChannel))[i];
  }
  TUTTI_HD size_t usedBytes() const {
    return sizeof(DevHeader) + size_t(nch) * sizeof(DevChannel) + size_t(nops) * sizeof(DevOp);
  }
};
// data follows the header with no padding (usedBytes counts on it), and keeps 8-byte alignment
// for the channels and operations placed in it.
static_assert(sizeof(DevHeader) % 8 == 0 && sizeof(DevChannel) % 8 == 0 && sizeof(DevOp) % 8 == 0,
              "DevArgs packs 8-byte aligned parts");
static_assert(sizeof(DevArgs) == sizeof(DevHeader) + sizeof(DevArgs::data),
              "DevArgs::data must follow the header");
// Kernel parameters may be up to 32764 bytes on Volta and later with CUDA 12.1+.
static_assert(sizeof(DevArgs) < 32000, "DevArgs must fit the kernel parameter space");

// Packs w into *a (its header, channels 0 .. w.nch - 1, operations 0 .. w.nops - 1); returns
// a->usedBytes().
inline size_t packArgs(const DevWork& w, DevArgs* a) {
  static_cast<DevHeader&>(*a) = w;
  const size_t chBytes = size_t(w.nch) * sizeof(DevChannel);
  memcpy(a->data, w.ch, chBytes);
  memcpy(a->data + chBytes, w.ops, size_t(w.nops) * sizeof(DevOp));
  return a->usedBytes();
}

// A group's sends and receives to other ranks beyond kMaxOps, up to kMaxP2pOps: base's ops
// first, then `more`, run by a kernel of their own (p2pManyKernel), so that only groups that
// need the room pay for the bigger parameter space.
constexpr int kMaxP2pOps = 64;
struct DevP2pWork {
  DevWork base;
  DevOp more[kMaxP2pOps - kMaxOps];
  int32_t nmore = 0;
};
static_assert(sizeof(DevP2pWork) < 32000, "DevP2pWork must fit the kernel parameter space");

// Kernels are chosen by (datatype, function, protocol); the collective is data.
enum Fn : int32_t { kFnSum = 0, kFnProd, kFnMax, kFnMin, kNumFns };
constexpr int kNumDtypes = 12;
constexpr int kNumProtos = 2;

}  // namespace tutti::dev
