// The transport interface. Every connection is a one-directional FIFO between two ranks on one
// channel: kSlots slots for payloads, and (shm) kSteps small cells for small ones. The producer
// fills the payload's place (FifoView::payload: cell step % kSteps, or slot step % kSlots),
// records its size in word step % kSteps and publishes tail = step + 1 (and, where the FIFO
// has cells, the step's cell word: below); the consumer reads it and publishes head = step + 1,
// which frees the place. Up to kSteps steps may be in flight
// while each holds a small payload, kSlots otherwise (FifoView::window). Engines see only this
// (FifoView); where the slots live and how bytes cross between the ranks (shared memory, a
// proxy thread and sockets, ...) is each transport's business.
#pragma once

#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "runtime/status.h"

namespace tutti {
class Comm;
struct PeerInfo;
}  // namespace tutti

namespace tutti::transport {

// Slots per FIFO, each of NCCL_BUFFSIZE / kSlots bytes: the most payloads bigger than a cell
// in flight (device kernels: dev::kSteps, every payload in a slot).
constexpr int kSlots = 8;
// Size words per FIFO, and cells (FifoView::cells): the most steps in flight. Small steps run
// this far ahead, so that ranks crowded on few cores each do more operations per time slice
// instead of switching every few. 8 ranks on 2 cores over shm, 64 B broadcasts in place, every
// variant in turn in random order between two cache-line round trips, medians, us. First
// with every step in a slot and kSteps slots: 8 (as before) 2.90, 32 1.60, 128 1.39, Open MPI
// 1.18 (both trips under 150 ns, 490-500 runs each); both over 250 ns (35-59 runs) 3.48,
// 2.25, 2.11, 1.58. With cells, 8 / 32 steps / Open MPI: 3.29 / 1.87 / 1.37 (105-126 runs),
// slow 3.80 / 2.49 / 1.72 (34-55); 32 / 64 steps / Open MPI: 1.98 / 1.70 / 1.42 (192-218
// runs), slow 2.59 / 2.34 / 1.75 (53-75). The 8 B all-reduce and 64 B all-gather (every rank
// waits for every other each time) did not move: 15.4 / 15.2 and 14.7 / 15.3 us with 8 / 32.
constexpr int kSteps = 64;
// Flag in a slot's size word: the last slot of a point-to-point message.
constexpr uint64_t kLastSlot = 1ull << 62;
// Flag in a slot's size word: not data but the way an operation goes, passed down the ring
// chain (cpu::passWay): the broadcast by the machine's state going flat, the big crowded
// all-gather's doubling or ring (Engine).
constexpr uint64_t kWaySlot = 1ull << 61;
constexpr uint64_t kSizeMask = (1ull << 40) - 1;
// FIFOs with cells (shm): each cell opens with a word that carries the step's size word and
// the step's number (its low 21 bits, (step + 1) << 40), written last with release; the
// payload follows it, so a small one shares the word's cache line. The receiver waits on that
// word instead of tail and takes the size from it: one line crosses between the CPUs where
// tail, the size word and the payload took three, one after the other (each read waits for
// the one before). A cell is reused kSteps steps later, so a stale word is a whole number of
// kSteps behind and never matches. (A cell holds its word and cellBytes: cellStrideFor.) 2 ranks
// over shm, 8 B all-gather, old / new / Open MPI, medians of 7 rounds in random order, us:
// 0.29 / 0.20 / 0.14 with the CPUs on one die, 0.65 / 0.37 / 0.39 on two (docs/host-results.md,
// "Small steps over shm").
constexpr size_t kCellHeader = 8;
constexpr int kCellSeqShift = 40;
constexpr uint64_t kCellSeqMask = ((1ull << 21) - 1) << kCellSeqShift;
inline uint64_t cellSeq(uint64_t step) { return ((step + 1) << kCellSeqShift) & kCellSeqMask; }

// Lives next to the slots, shared by both sides when the transport maps memory across ranks.
struct alignas(64) FifoCtrl {
  std::atomic<uint64_t> tail;
  // 1 + the CPU the sender ran on when it last posted a slot or waited (0: not known yet);
  // receiverCpu, the same for the receiver (freeing a slot, waiting). Host engines only,
  // read where both sides map this block (Connection::sharedCtrl): a wait does not busy-poll
  // for a peer that shares its CPU (Waiter::peerOnMyCpu).
  std::atomic<int32_t> senderCpu;
  char pad0[52];
  std::atomic<uint64_t> head;
  std::atomic<int32_t> receiverCpu;
  char pad1[52];
  std::atomic<uint64_t> sizes[kSteps];
  // Single copy (shm): the address of a step's payload in the sender's memory, or 0 when the
  // payload is in its slot or cell. Written before tail (and the cell word) publishes the step.
  std::atomic<uint64_t> src[kSteps];
  // Set by either side when its communicator fails or aborts: the other stops waiting.
  std::atomic<uint32_t> broken;
  uint32_t magic;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "FIFO counters cross processes");

// How a sender wants a payload sent (Connection::sendFrom).
enum class SendHow : uint8_t {
  // The transport's own choice (shm: adaptive, through the slots while they copy fast).
  kAdaptive,
  // By address whenever the transport can (shm: from its single-copy minimum, whatever state
  // the adaptive choice is in), for algorithms in which copying through a slot doubles the
  // work.
  kByAddress,
  // As kByAddress, where the sender has one receiver to help at most (an exchange, each side
  // busy with its own receive: the two-rank all-gather, a doubling stage; or a two-rank
  // broadcast): shm copies such a payload in few big pieces (each costs a system call and a
  // claim), where many small ones balance a root's help among several receivers.
  kTwoRanks,
  // Through the slot, whatever the adaptive choice says (the two-rank all-gather, when
  // its run-time choice says the slots are faster now: Engine, TwoWayTuner).
  kSlot,
};

class Connection;

// Records the CPU the calling thread runs on in one of FifoCtrl's CPU fields.
inline int32_t noteCpu(std::atomic<int32_t>& field) {
  const int32_t cpu = sched_getcpu() + 1;
  if (field.load(std::memory_order_relaxed) != cpu) field.store(cpu, std::memory_order_relaxed);
  return cpu;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

// A FIFO's cells (FifoView::cells) for slots of slotBytes: kSteps of slotBytes / kSteps bytes
// each, at most kMaxCellBytes (2 KiB, reached at shm's default 128 KiB slots), plus a line each
// for its word (cellStrideFor): at most 132 KiB per FIFO, all of it committed when the link is
// made (prefaultSlots). 0 (no cells) where a cell would be under a cache line. /dev/shm is 64
// MiB in a default container; 8 ranks have 56 flat links, whose cells take 7.2 MiB whatever
// NCCL_BUFFSIZE says.
constexpr size_t kMaxCellBytes = 2048;
inline size_t cellBytesFor(size_t slotBytes) {
  const size_t c = std::min(kMaxCellBytes, slotBytes / kSteps / 64 * 64);
  return c >= 64 ? c : 0;
}
// Each cell takes a cache line more than it holds: its word (kCellHeader) comes first, so that
// a payload of a power of two (2 KiB: 8 crowded ranks' 2 KiB broadcasts took 1.86 us through
// the slots' window of 8 against 0.96 with 64 steps ahead) still fits.
inline size_t cellStrideFor(size_t cellBytes) { return cellBytes ? cellBytes + 64 : 0; }

// What an engine holds for one end of one connection.
struct FifoView {
  FifoCtrl* ctrl = nullptr;
  char* slots = nullptr;
  size_t slotBytes = 0;
  uint64_t step = 0;      // this end's next step; steps continue across operations
  uint64_t headSeen = 0;  // sender: head as last read (host engines: HostPrims::acquireSend)
  int peer = -1;
  int channel = 0;
  Connection* conn = nullptr;
  // p2p (GPU ranks): ctrl and the slots are device addresses (kernels use them; host code
  // must not); the LL slots follow the Simple ones.
  char* ll = nullptr;
  size_t llSlotBytes = 0;
  uint64_t* ownStep = nullptr;  // sender: its step, in its own GPU memory (dev::DevConn::step)
  bool gpuScope = false;        // both ends on one GPU in one process (dev::DevConn::gpuScope)
  // p2p, both ends in one process: the broken word, in mapped host memory (device address),
  // instead of ctrl->broken.
  uint32_t* broken = nullptr;
  // Host FIFOs with cells (shm): kSteps cells of cellBytes after the slots, one per size word.
  // A payload that fits one goes there, and such steps may run kSteps ahead (window). None:
  // every payload in a slot, kSlots steps in flight (tcp, whose sender's head counts what went
  // onto the wire, not what the receiver consumed; p2p, for device kernels).
  char* cells = nullptr;
  size_t cellBytes = 0;

  bool inCell(size_t bytes) const { return cells != nullptr && bytes <= cellBytes; }
  // Cell s % kSteps: its word (see kCellHeader), then up to cellBytes of payload.
  char* cell(uint64_t s) const { return cells + (s % kSteps) * cellStrideFor(cellBytes); }
  std::atomic<uint64_t>& cellWord(uint64_t s) const {
    return *reinterpret_cast<std::atomic<uint64_t>*>(cell(s));
  }
  // Slot s % kSlots.
  char* slot(uint64_t s) const { return slots + (s % kSlots) * slotBytes; }
  // Where step s's payload of `bytes` lies: its cell if it fits one, else its slot. Both ends
  // derive it from the size word, so they agree.
  char* payload(uint64_t s, size_t bytes) const {
    return inCell(bytes) ? cell(s) + kCellHeader : slot(s);
  }
  // How many steps may be in flight (posted, not yet consumed) before a sender posts a payload
  // of `bytes`: kSteps for one in a cell, whose place is free once head passed s - kSteps;
  // kSlots for one in a slot, free once head passed s - kSlots. By size alone, whether the
  // payload goes by address or not: the transports' per-step state is per size word.
  uint64_t window(size_t bytes) const { return inCell(bytes) ? kSteps : kSlots; }
};

// A FIFO that device kernels use (p2p, in GPU memory or mapped host memory): the control
// block, kSlots Simple slots, then kSlots LL slots. The p2p transport and the kernels' CPU
// emulation (tests/emu) both lay it out here, so that the emulation runs over what p2p makes.
inline size_t deviceFifoBytes(size_t slotBytes, size_t llSlotBytes) {
  return sizeof(FifoCtrl) + kSlots * (slotBytes + llSlotBytes);
}
inline void layDeviceFifo(char* base, size_t slotBytes, size_t llSlotBytes, FifoView* v) {
  v->ctrl = reinterpret_cast<FifoCtrl*>(base);
  v->slots = base + sizeof(FifoCtrl);
  v->slotBytes = slotBytes;
  v->ll = v->slots + kSlots * slotBytes;
  v->llSlotBytes = llSlotBytes;
}

// Maps the first page(s) of every slot, and every cell, into this process at connection setup,
// where a first touch during an operation would cost a page fault per slot and side. 8 ranks
// on 2 cores over shm, 8 B all-reduces: the first 8 operations after init took 100-450 us
// each, later ones 20. Only the first page of a slot: small messages use no more, and the rest
// of a slot costs memory only once a big message fills it. Nothing may flow through the FIFO
// yet.
inline void prefaultSlots(const FifoView& f) {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  auto populate = [page](const char* from, size_t bytes) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(from);
    const uintptr_t start = a & ~(page - 1);
    const uintptr_t end = (a + bytes + page - 1) & ~(page - 1);
    if (madvise(reinterpret_cast<void*>(start), end - start, MADV_POPULATE_WRITE) == 0) return;
    // Older kernels (EINVAL): touch each page. Not after other failures: on a full /dev/shm
    // (EFAULT) a touch would raise SIGBUS; the pages then fault in when first used (and fail
    // as they would have).
    if (errno != EINVAL) return;
    for (uintptr_t p = start; p < end; p += page) {
      volatile char* c = reinterpret_cast<volatile char*>(p);
      *c = *c;
    }
  };
  for (int k = 0; k < kSlots; ++k) {
    populate(f.slot(uint64_t(k)), std::min<size_t>(f.slotBytes, page));
  }
  if (f.cells) populate(f.cells, kSteps * cellStrideFor(f.cellBytes));
}

// Carries the receiver's setup information to the sender over the bootstrap
// (and a sender's answer back, Connection::reply).
struct Descriptor {
  char bytes[256];
};

class Connection {
 public:
  virtual ~Connection() = default;
  FifoView& fifo() { return fifo_; }
  // Whether kick()/poll() do anything (tcp); shm connections skip the calls.
  bool drivesIo() const { return drivesIo_; }
  // The engine published a counter: move bytes now, on the caller's thread where possible,
  // and hand the rest to the transport's proxy.
  virtual void kick() {}
  // A waiting engine lends its thread: make what progress is possible without blocking.
  virtual void poll() {}
  // Sleep until this connection's sockets can move bytes, or `ms` passes (tcp: poll(2)), so
  // that a rank sharing its core with others waits in the kernel, not in sched_yield.
  virtual void block(int ms) { (void)ms; }
  // Ok while the connection is usable; a RemoteError naming the peer once it is not.
  virtual Status health() const = 0;
  // Receiver side: completes the setup once the sender has connected.
  virtual Status finish() { return Status::Ok(); }
  // A setup in which the sender chooses (p2p: GPU memory where its CUDA IPC open of the
  // receiver's FIFO works, else mapped host memory) and tells the receiver. Sender side: true,
  // and what to send in `out`, where the receiver's descriptor asked for an answer. Receiver
  // side: whether it waits for one, and the answer, taken before finish() and before any
  // kernel uses the FIFO.
  virtual bool reply(Descriptor* out) {
    (void)out;
    return false;
  }
  virtual bool awaitsReply() const { return false; }
  virtual Status takeReply(const Descriptor& in) {
    (void)in;
    return Status::Ok();
  }
  // Tell the peer this side is gone (the communicator failed or aborted).
  virtual void breakLink() {
    if (fifo_.ctrl) fifo_.ctrl->broken.store(1, std::memory_order_release);
  }
  // A link this side gave up while a peer's kernel could still use it (an abort with work in
  // flight): its destructor frees nothing, leaving the memory to the process's exit. Returns
  // the bytes of it this side allocated.
  virtual size_t abandon() { return 0; }
  // An abort: memory of this side that a peer in another process writes into is not freed with
  // the link but kept a while (that peer's kernel, under way or queued, may still write there:
  // it checks the broken word only while it waits, and a sender with free slots does not
  // wait), lest a free hand it to this process's next allocation while that peer writes; a
  // later communicator's links free it. Returns the bytes kept.
  virtual size_t keepIfOtherProcessWrites() { return 0; }
  // Direct transfers: bytes go between the caller's buffers and the peer without a copy
  // through a slot. tcp: the socket calls copy anyway, so they use the caller's buffers;
  // shm: the receiver copies straight from the sender's buffer (single copy).
  bool direct() const { return direct_; }
  // Whether both sides use the one FifoCtrl (shared memory), so that each can see the CPU
  // the other last ran on.
  bool sharedCtrl() const { return sharedCtrl_; }
  // Whether the peer runs on this machine (so it may share this rank's CPU) behind a FIFO
  // that cannot show where (tcp over loopback or between network namespaces): waits stop
  // busy-polling for it for a while when their spins keep running out (Waiter).
  bool localPeerUnseen() const { return localPeerUnseen_; }
  // For such a peer: spins in a row that ran out, and waits left that do not spin (Waiter;
  // touched only by the thread that waits on this connection).
  uint32_t unseenMisses = 0;
  uint32_t unseenRest = 0;
  // Receiver: payloads the engine asked for in its own buffer that landed in the slot instead
  // and were copied out (shm: those at or above the direct minimum that were sent through the
  // slots; tcp: none while the engine says where it wants each step before it waits for it).
  // Diagnostics and tests; touched only by the thread that receives on this connection.
  uint64_t landedInSlot = 0;
  // Sender: the payload of `step` (not yet published) is `bytes` at `src`. Returns false when
  // the transport copied it into the slot now; true when it keeps using src, which must then
  // stay valid and unchanged until head passes step. how: SendHow.
  virtual bool sendFrom(uint64_t step, const void* src, size_t bytes, SendHow how) {
    (void)how;
    memcpy(fifo_.payload(step, bytes), src, bytes);
    return false;
  }
  // Sender: whether a payload of `bytes` sent with a SendHow other than kAdaptive goes by
  // address for certain (then it need not fit a slot). Only where both sides share the
  // FifoCtrl (sharedCtrl): receivers learn of such a payload from FifoCtrl::src
  // (HostPrims::nextByAddress), and expect slot-sized chunks elsewhere.
  virtual bool sendsByAddress(size_t bytes) const {
    (void)bytes;
    return false;
  }
  // The smallest payload a direct transfer may carry; smaller ones go through the slots the
  // plain way (so engines need not take the direct paths for them).
  virtual size_t directMinBytes() const { return 0; }
  // Whether sending by address pays where the receiver wants the payload in its slot (to
  // reduce it): tcp's socket copies anyway, so sending from the caller's buffer saves the copy
  // into the slot; shm's receiver would only copy into its slot, through a system call, what
  // the sender could have copied there itself.
  virtual bool directPaysIntoSlot() const { return true; }
  // Sender: whether big payloads go by address (single copy) at the moment.
  virtual bool bigByAddress() const { return false; }
  // Sender: whether the last verdict on copies into this link's slots was "slow" (shm's
  // adaptive single copy: the two CPUs sit on different dies) and still holds; and forgetting
  // it, so that the next big payloads go through the slots and time the copies again.
  virtual bool copiesRunSlow() const { return false; }
  virtual void forgetSlowCopies() {}
  // Receiver: the engine is about to wait for `step`, whose payload should be `bytes` long; it
  // wants it in dst (nullptr: in the slot). step UINT64_MAX: no wait pending -- the engine's
  // buffers are about to go back to its caller. From the call on the peer may write dst (shm
  // single copy), until land() and landed() complete the step or the UINT64_MAX call returns,
  // so every operation that posts a step must end with that call (HostPrims::finish).
  virtual void recvInto(uint64_t step, void* dst, size_t bytes) {
    (void)step;
    (void)dst;
    (void)bytes;
  }
  // Receiver, once `step` is posted (transport::posted): brings its payload to the dst of recvInto
  // (*inDst = true) or to the slot (*inDst = false), copying if the transport must.
  virtual Status land(uint64_t step, bool* inDst) {
    (void)step;
    *inDst = false;
    return Status::Ok();
  }
  // Receiver, after land: false while part of the payload is still being copied by the
  // sender (shm single copy, both sides copying pieces); the engine waits until true.
  virtual bool landed(uint64_t step) {
    (void)step;
    return true;
  }
  // Sender, while it waits for a free slot or for the receiver to finish: do a piece of the
  // receiver's copy of a payload sent by address, if there is one to do. True when it did.
  virtual bool help() { return false; }
  virtual const char* transportName() const = 0;
  // The first socket under this connection, or -1 (diagnostics and fault-injection tests).
  virtual int rawSocket() const { return -1; }

 protected:
  FifoView fifo_;
  bool drivesIo_ = false;
  bool direct_ = false;
  bool sharedCtrl_ = false;
  bool localPeerUnseen_ = false;
};

// Host engines publish a step through these: the sender after filling slot f.step (its size
// recorded), the receiver after consuming it. Each records its CPU where the peer can read it
// (shared control blocks only), moves the counter, and lets tcp move bytes at once.
inline void postTail(FifoView& f) {
  if (f.conn->sharedCtrl()) noteCpu(f.ctrl->senderCpu);
  if (f.cells) {
    const uint64_t word = f.ctrl->sizes[f.step % kSteps].load(std::memory_order_relaxed);
    f.cellWord(f.step).store(cellSeq(f.step) | word, std::memory_order_release);
  }
  f.ctrl->tail.store(++f.step, std::memory_order_release);
  if (f.conn->drivesIo()) f.conn->kick();
}
// Receiver: whether the sender has posted step f.step, and then (only then) its size word.
inline bool posted(const FifoView& f) {
  if (f.cells) {
    return (f.cellWord(f.step).load(std::memory_order_acquire) & kCellSeqMask) == cellSeq(f.step);
  }
  return f.ctrl->tail.load(std::memory_order_acquire) > f.step;
}
inline uint64_t postedWord(const FifoView& f) {
  if (f.cells) return f.cellWord(f.step).load(std::memory_order_relaxed) & ~kCellSeqMask;
  return f.ctrl->sizes[f.step % kSteps].load(std::memory_order_relaxed);
}
inline void postHead(FifoView& f) {
  if (f.conn->sharedCtrl()) noteCpu(f.ctrl->receiverCpu);
  f.ctrl->head.store(++f.step, std::memory_order_release);
  if (f.conn->drivesIo()) f.conn->kick();
}

struct ConnSpec {
  int peer;
  int channel;
  size_t slotBytes;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // Whether this transport can join the two ranks (shm: same host).
  virtual bool canConnect(const PeerInfo& me, const PeerInfo& peer) const = 0;
  // Receiver side first: allocate the FIFO and describe it for the sender.
  virtual Result<std::unique_ptr<Connection>> setupRecv(const ConnSpec& spec, Descriptor* out) = 0;
  // Sender side: attach to the receiver's FIFO from its descriptor.
  virtual Result<std::unique_ptr<Connection>> connectSend(const ConnSpec& spec,
                                                          const Descriptor& in) = 0;
  // Waits (up to `seconds`) until everything posted to this transport's send FIFOs has left:
  // a rank that finished its last send may destroy its communicator at once.
  virtual void flush(double seconds) { (void)seconds; }
  // Stop background work before connections are freed.
  virtual void shutdown() {}
};

// The registry: transports are tried in this order for each pair of ranks.
std::unique_ptr<Transport> makeShmTransport(Comm& comm);
std::unique_ptr<Transport> makeTcpTransport(Comm& comm);
// GPU ranks on one host (device kernels' FIFOs); only in builds with CUDA.
std::unique_ptr<Transport> makeP2pTransport(Comm& comm);

}  // namespace tutti::transport
