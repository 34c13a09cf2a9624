// p2p: FIFOs for GPU ranks on one host, which device kernels read and write directly.
//   device mode  -- the receiver allocates the FIFO (control block, Simple slots, LL slots) in
//                   its GPU's memory; a sender in the same process uses the pointer (enabling
//                   peer access when the GPUs differ), one in another process opens it with
//                   CUDA IPC. Ranks that share one GPU use this too: it is how the whole GPU
//                   path runs on a one-GPU machine. Where the receiver cannot see the sender's
//                   GPU (CUDA_VISIBLE_DEVICES of one GPU per process, as launchers often set
//                   it), it cannot ask CUDA whether that GPU reaches its own: it offers both
//                   this and a mapped segment (kEither), the sender tries the IPC open (CUDA
//                   opens handles of GPUs the process cannot see) and answers which it took.
//   mapped mode  -- NCCL_P2P_DISABLE=1, or GPUs that cannot reach each other: the FIFO is a
//                   POSIX shared-memory segment that both sides register with CUDA as mapped
//                   host memory, so kernels on both GPUs reach it over PCIe (NCCL's "shm"
//                   path for GPU buffers).
// Host code never dereferences a FIFO of this transport: FifoView holds device addresses.
// The word that says a side gave up is in host memory both ends' kernels reach (FifoCtrl::broken
// of a mapped FIFO; for a FIFO in GPU memory, a word of a pooled pinned page where both ends are
// in one process, else a page of POSIX shared memory both register as mapped): abort sets it
// with a store, never with a copy on a stream, which could queue behind a kernel that waits for
// that very word. An abandoned link (an abort with work in flight, see DeviceEngine::noteAbort)
// leaves its memory to the process's exit: the peer's kernel may still touch it, and a free may
// wait for the GPU. At any abort, a FIFO in GPU memory that a sender in another process writes
// into is kept a while (KeptFifos), then freed by the process's next p2p links.
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "runtime/comm.h"
#include "runtime/cuda_scope.h"
#include "runtime/device_engine.h"
#include "runtime/env.h"
#include "runtime/log.h"
#include "transports/p2p/p2p_pools.h"
#include "transports/transport.h"

namespace tutti::transport {
namespace {

using p2p::BrokenWords;
using p2p::KeptFifos;

// kEither: in a descriptor only, GPU memory if the sender's CUDA IPC open of it works, else the
// spare mapped segment; the sender answers (P2pReply) with the one it took.
enum Mode : int32_t { kDevice = 1, kMapped = 2, kEither = 3 };

struct P2pDesc {
  uint64_t bytes;
  uint64_t slotBytes;
  uint64_t llSlotBytes;
  uint64_t devPtr;     // device mode, same process
  uint64_t brokenPtr;  // device mode, same process: the broken word (BrokenWords)
  int32_t mode;
  int32_t pad;
  cudaIpcMemHandle_t ipc;  // device mode, other processes
  // Mapped mode: the FIFO's segment; device mode, other processes: the broken word's page.
  // "/tutti-gpub-<pid>-<8 hex>-<rank>-<counter>" takes at most 50 (nameSegment).
  char shmName[64];
  char spareName[64];  // kEither: the mapped segment the sender takes if its IPC open fails
};
static_assert(sizeof(P2pDesc) <= sizeof(Descriptor));

struct P2pReply {
  int32_t mode;  // kDevice or kMapped: what the sender took of a kEither descriptor
};

Status cudaFailed(const std::string& what, cudaError_t e) {
  cudaGetLastError();  // not sticky for the application
  return Status(Code::kCudaError, "p2p: " + what + ": " + cudaGetErrorString(e));
}

// The local device index of a PCI bus id, or -1.
int deviceOfBus(const char* busId) {
  int d = -1;
  if (!busId[0] || cudaDeviceGetByPCIBusId(&d, busId) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return d;
}

class P2pConnection : public Connection {
 public:
  struct Memory {
    Mode mode;
    bool owner;         // the receiver: allocated it
    bool ipcOpened;     // sender in another process: opened the handle
    char* dev;          // the device address of the FIFO
    uint64_t* ownStep;  // sender: its step word, in its own GPU memory
    void* host;         // mapped mode: this process's mapping
    size_t bytes;
    bool gpuScope;  // device mode, both ends on one GPU in one process
    std::string shmName;
    uint32_t* broken;      // device mode, same process: the broken word (host address; held)
    uint32_t* brokenPage;  // device mode, other processes: this process's mapping of the page
                           // that holds the broken word (registered; the receiver named it)
    uint32_t* brokenDev;   // the device address of either
    // Receiver of a kEither descriptor, until the sender's answer: the spare segment, mapped
    // here (not registered) and still named; and where to note that the sender took the spare
    // (the transport's, for this peer's later links).
    void* spareHost;
    std::string spareName;
    std::set<int>* tookSpare;
    // Whether the GPU memory a sender could not open is freed as soon as it says so (a cudaFree
    // waits for the whole GPU: not where ranks on threads share it, one of whose kernels may
    // wait for this thread's next call); else the destructor frees it.
    bool freeUnusedNow;
    char* unusedDev;
    uint32_t* unusedPage;
    P2pReply answer;  // sender of a kEither descriptor: what it took (mode 0: no answer owed)
  };
  P2pConnection(const ConnSpec& spec, size_t llSlotBytes, Memory m) : m_(std::move(m)) {
    layDeviceFifo(m_.dev, spec.slotBytes, llSlotBytes, &fifo_);
    fifo_.peer = spec.peer;
    fifo_.channel = spec.channel;
    fifo_.conn = this;
    fifo_.ownStep = m_.ownStep;
    fifo_.gpuScope = m_.gpuScope;
    fifo_.broken = m_.brokenDev;
  }
  ~P2pConnection() override {
    if (m_.owner && !m_.shmName.empty()) shm_unlink(m_.shmName.c_str());  // gone if both had it
    if (!m_.spareName.empty()) shm_unlink(m_.spareName.c_str());          // (no answer came)
    if (m_.spareHost) munmap(m_.spareHost, m_.bytes);
    if (abandoned_) {
      // The peer's kernel may still read or write this FIFO and poll its broken word (it stops
      // within its next checks), and cudaFree, cudaIpcCloseMemHandle and cudaHostUnregister
      // may wait for the whole GPU, where another communicator's kernel may wait for this very
      // thread. So an abandoned link's memory stays until the process exits.
      return;
    }
    // Same process: the FIFO goes with the last of its two ends (BrokenWords::drop).
    char* lastEnd = m_.broken ? BrokenWords::drop(m_.broken, m_.owner ? m_.dev : nullptr) : nullptr;
    // A failure of ours is cleared (not sticky for the application); an error the application
    // has not read yet stays for it.
    bool failed = false;
    auto check = [&failed](cudaError_t e) { failed = failed || e != cudaSuccess; };
    if (m_.brokenPage) {
      check(cudaHostUnregister(m_.brokenPage));
      munmap(m_.brokenPage, kBrokenPageBytes);
    }
    if (m_.ownStep) check(cudaFree(m_.ownStep));
    if (m_.unusedPage) {
      check(cudaHostUnregister(m_.unusedPage));
      munmap(m_.unusedPage, kBrokenPageBytes);
    }
    if (m_.unusedDev) check(cudaFree(m_.unusedDev));  // the sender never opened it
    if (m_.mode == kDevice) {
      if (m_.ipcOpened) check(cudaIpcCloseMemHandle(m_.dev));
      if (m_.owner && !m_.broken) {  // another process's end: its own mapping
        if (kept_) {
          KeptFifos::keep(m_.dev, m_.bytes);  // that process's sender may still write
        } else {
          check(cudaFree(m_.dev));
        }
      }
      if (lastEnd) check(cudaFree(lastEnd));
    } else {
      check(cudaHostUnregister(m_.host));
      munmap(m_.host, m_.bytes);
    }
    if (failed) cudaGetLastError();
  }
  Status health() const override { return Status::Ok(); }
  // Tell the peer's kernels this side is gone (or this side's, that the peer's process exited):
  // they poll the broken word while they wait. A host store in every mode, no CUDA call (see
  // the top of this file); the memory is freed as usual unless abandon() ran.
  void breakLink() override {
    uint32_t* w = m_.broken ? m_.broken : m_.brokenPage;
    if (w) {
      __atomic_store_n(w, 1u, __ATOMIC_RELEASE);
    } else if (m_.mode == kMapped) {
      static_cast<FifoCtrl*>(m_.host)->broken.store(1);
    }
    // No answer yet (a setup that failed half way): the sender may have taken the spare.
    if (m_.spareHost) static_cast<FifoCtrl*>(m_.spareHost)->broken.store(1);
  }
  size_t abandon() override {
    abandoned_ = true;
    return m_.owner ? m_.bytes : 0;
  }
  size_t keepIfOtherProcessWrites() override {
    // The receiver's FIFO in GPU memory, opened over CUDA IPC by a sender in another process
    // (a mapped FIFO is shared memory, which outlives this side's unmapping).
    if (m_.mode != kDevice || !m_.owner || m_.broken) return 0;
    kept_ = true;
    return m_.bytes;
  }
  const char* transportName() const override { return m_.mode == kDevice ? "p2p" : "shm/mapped"; }

  bool reply(Descriptor* out) override {
    if (m_.answer.mode == 0) return false;
    memcpy(out->bytes, &m_.answer, sizeof(m_.answer));
    return true;
  }
  bool awaitsReply() const override { return m_.spareHost != nullptr; }
  // The sender's choice of a kEither descriptor. Its kernels may already write into what it
  // took (zero since it was made, so nothing here clears it).
  Status takeReply(const Descriptor& in) override {
    P2pReply r;
    memcpy(&r, in.bytes, sizeof(r));
    if (r.mode == kDevice) {
      shm_unlink(m_.spareName.c_str());
      munmap(m_.spareHost, m_.bytes);
    } else if (r.mode == kMapped) {
      char* dev = nullptr;
      Status s = registerMapped(m_.spareHost, m_.bytes, &dev);
      if (!s.ok()) return s;
      shm_unlink(m_.shmName.c_str());  // the broken word's page, which the sender never opened
      m_.shmName.clear();
      // What the sender could not open goes now where it may (see freeUnusedNow), not with the
      // link: a FIFO's bytes of GPU memory per link otherwise.
      if (m_.freeUnusedNow) {
        const cudaError_t unregistered = cudaHostUnregister(m_.brokenPage);
        munmap(m_.brokenPage, kBrokenPageBytes);
        const cudaError_t freed = cudaFree(m_.dev);
        if (unregistered != cudaSuccess || freed != cudaSuccess) cudaGetLastError();
      } else {
        m_.unusedPage = m_.brokenPage;
        m_.unusedDev = m_.dev;
      }
      m_.brokenPage = m_.brokenDev = nullptr;  // a mapped FIFO's broken word is FifoCtrl's
      m_.mode = kMapped;
      m_.host = m_.spareHost;
      m_.dev = dev;
      layDeviceFifo(m_.dev, fifo_.slotBytes, fifo_.llSlotBytes, &fifo_);
      fifo_.broken = nullptr;
    } else {
      return internalError("p2p: rank " + std::to_string(fifo_.peer) +
                           " answered with unknown mode " + std::to_string(r.mode));
    }
    m_.spareHost = nullptr;
    m_.spareName.clear();
    // A peer whose sender took the spare gets mapped memory at once from now on. (Not one
    // that took GPU memory: an offer of both costs a name and a mapping, and keeps the way
    // back to mapped memory should a later open fail.)
    if (m_.tookSpare && r.mode == kMapped) m_.tookSpare->insert(fifo_.peer);
    return Status::Ok();
  }

  // Registers a mapping with CUDA as mapped memory (both ends' kernels reach it): its device
  // address.
  static Status registerMapped(void* host, size_t bytes, char** dev) {
    if (cudaError_t e =
            cudaHostRegister(host, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
        e != cudaSuccess) {
      return cudaFailed("cudaHostRegister of shared memory", e);
    }
    void* d = nullptr;
    if (cudaError_t e = cudaHostGetDevicePointer(&d, host, 0); e != cudaSuccess) {
      cudaHostUnregister(host);
      return cudaFailed("cudaHostGetDevicePointer", e);
    }
    *dev = static_cast<char*>(d);
    return Status::Ok();
  }
  static constexpr size_t kBrokenPageBytes = 4096;

 private:
  Memory m_;
  bool abandoned_ = false;  // the destructor frees nothing (set before it, on its thread)
  bool kept_ = false;       // the destructor hands the FIFO to KeptFifos
};

class P2pTransport : public Transport {
 public:
  explicit P2pTransport(Comm& comm) : comm_(comm) {
    p2pDisabled_ = me().device.p2pDisabled != 0;  // NCCL_P2P_DISABLE, as read at init
    // TUTTI_LL_SLOT_BYTES, as read at init and compared between GPU ranks
    llSlotBytes_ = size_t(std::clamp<int64_t>(me().device.llSlotBytes, 256, 1 << 20)) / 16 * 16;
    if (const size_t freed = KeptFifos::freeOld()) {
      TUTTI_INFO(log::kInit,
                 "rank %d: freed %zu bytes of GPU memory an abort kept (FIFOs that "
                 "ranks in other processes wrote into)",
                 comm_.rank(), freed);
    }
  }
  const char* name() const override { return "p2p"; }

  bool canConnect(const PeerInfo& me, const PeerInfo& peer) const override {
    return me.hostHash == peer.hostHash && me.cudaDev >= 0 && peer.cudaDev >= 0;
  }

  Result<std::unique_ptr<Connection>> setupRecv(const ConnSpec& spec, Descriptor* out) override {
    TUTTI_TRY(useDevice());
    P2pDesc d{};
    d.slotBytes = spec.slotBytes;
    d.llSlotBytes = llSlotBytes_;
    d.bytes = deviceFifoBytes(spec.slotBytes, llSlotBytes_);
    P2pConnection::Memory m{};
    m.owner = true;
    m.bytes = d.bytes;
    const Mode choice = choiceWith(spec.peer);
    if (choice != kMapped) {
      d.mode = choice;
      m.mode = kDevice;
      m.gpuScope = sameProcess(spec.peer) && sameGpu(spec.peer);
      void* p = nullptr;
      if (cudaError_t e = cudaMalloc(&p, d.bytes); e != cudaSuccess)
        return cudaFailed("cudaMalloc of a " + std::to_string(d.bytes) + "-byte FIFO", e);
      m.dev = static_cast<char*>(p);
      // All of it: LL receivers take any line whose flags match, and recycled memory may
      // hold an old FIFO's lines with small step numbers in them. Done before the descriptor
      // leaves, so no sender can write before the zeros land.
      if (Status z = zero(p, d.bytes); !z.ok()) {
        cudaFree(p);
        return z;
      }
      d.devPtr = reinterpret_cast<uint64_t>(p);
      if (!sameProcess(spec.peer)) {
        if (cudaError_t e = cudaIpcGetMemHandle(&d.ipc, p); e != cudaSuccess) {
          cudaFree(p);
          return cudaFailed("cudaIpcGetMemHandle", e);
        }
        nameSegment("gpub", d.shmName, sizeof(d.shmName));
        Result<int> fd = createSegment(d.shmName, P2pConnection::kBrokenPageBytes);
        if (!fd.ok()) {
          cudaFree(p);
          return fd.status();
        }
        void* page = nullptr;
        char* dev = nullptr;
        Status mapped = mapRegistered(fd.value(), P2pConnection::kBrokenPageBytes, &page, &dev);
        close(fd.value());
        if (!mapped.ok()) {
          shm_unlink(d.shmName);
          cudaFree(p);
          return mapped;
        }
        m.shmName = d.shmName;  // unlinked by the sender once it has it, else by the destructor
        m.brokenPage = static_cast<uint32_t*>(page);  // zero: a new segment
        m.brokenDev = reinterpret_cast<uint32_t*>(dev);
        if (choice == kEither) {
          // The spare: mapped now, registered only if the sender takes it; nothing here
          // touches it (a new segment is zero, and the sender may write first).
          nameSegment("gpus", d.spareName, sizeof(d.spareName));
          Result<int> spare = createSegment(d.spareName, d.bytes);
          Result<void*> h = spare.ok() ? mapShared(spare.value(), d.bytes) : spare.status();
          if (spare.ok()) close(spare.value());
          if (!h.ok()) {
            if (spare.ok()) shm_unlink(d.spareName);
            P2pConnection dropped(spec, llSlotBytes_, m);  // gives back what m holds
            return h.status();
          }
          m.spareHost = h.value();
          m.spareName = d.spareName;
          m.tookSpare = &tookSpare_;
          m.freeUnusedNow = !comm_.deviceEngine().threadsShareGpuHere();  // (its links)
        }
      } else {
        cudaError_t e = cudaSuccess;
        const BrokenWords::Word w = BrokenWords::make(&e);
        if (!w.host) {
          cudaFree(p);
          return cudaFailed("a mapped word for the FIFO's broken flag", e);
        }
        m.broken = w.host;
        m.brokenDev = w.dev;
        d.brokenPtr = reinterpret_cast<uint64_t>(w.host);
      }
    } else {
      d.mode = m.mode = kMapped;
      nameSegment("gpu", d.shmName, sizeof(d.shmName));
      Result<int> fd = createSegment(d.shmName, d.bytes);
      if (!fd.ok()) return fd.status();
      Status mapped = mapRegistered(fd.value(), d.bytes, &m.host, &m.dev);
      close(fd.value());
      if (!mapped.ok()) {
        shm_unlink(d.shmName);
        return mapped;
      }
      m.shmName = d.shmName;
      memset(m.host, 0, sizeof(FifoCtrl));
    }
    memcpy(out->bytes, &d, sizeof(d));
    return std::unique_ptr<Connection>(new P2pConnection(spec, llSlotBytes_, m));
  }

  Result<std::unique_ptr<Connection>> connectSend(const ConnSpec& spec,
                                                  const Descriptor& in) override {
    TUTTI_TRY(useDevice());
    P2pDesc d;
    memcpy(&d, in.bytes, sizeof(d));
    d.shmName[sizeof(d.shmName) - 1] = 0;
    d.spareName[sizeof(d.spareName) - 1] = 0;
    if (d.slotBytes != spec.slotBytes || d.llSlotBytes != llSlotBytes_) {
      return invalidUsage("p2p: rank " + std::to_string(spec.peer) + " uses slots of " +
                          std::to_string(d.slotBytes) + "/" + std::to_string(d.llSlotBytes) +
                          " bytes, this rank " + std::to_string(spec.slotBytes) + "/" +
                          std::to_string(llSlotBytes_) +
                          " (NCCL_BUFFSIZE and TUTTI_LL_SLOT_BYTES must match)");
    }
    P2pConnection::Memory m{};
    m.mode = Mode(d.mode);
    m.bytes = d.bytes;
    if (d.mode == kEither && sameProcess(spec.peer)) {
      return internalError("p2p: rank " + std::to_string(spec.peer) +
                           " offered a choice of FIFOs to a rank of its own process");
    }
    if (d.mode == kDevice || d.mode == kEither) {
      if (sameProcess(spec.peer)) {
        TUTTI_TRY(enablePeerAccess(spec.peer));
        const BrokenWords::Word w = BrokenWords::hold(reinterpret_cast<uint32_t*>(d.brokenPtr));
        if (!w.host) {
          return internalError("p2p: rank " + std::to_string(spec.peer) +
                               "'s FIFO came without its broken word, or was freed");
        }
        m.broken = w.host;  // from here on m holds it: the dropped connection below gives it back
        m.brokenDev = w.dev;
        m.dev = reinterpret_cast<char*>(d.devPtr);
        m.gpuScope = sameGpu(spec.peer);
      } else {
        void* p = nullptr;
        // A peer whose FIFOs this rank could not open is not asked again.
        const bool knownNo = d.mode == kEither && noIpc_.count(spec.peer);
        cudaError_t e = cudaSuccess;
        if (!knownNo) e = cudaIpcOpenMemHandle(&p, d.ipc, cudaIpcMemLazyEnablePeerAccess);
        if (d.mode == kEither && (knownNo || e != cudaSuccess)) {
          if (!knownNo) {
            cudaGetLastError();  // not sticky for the application
            noteNoIpc(spec.peer, e);
          }
          m.mode = kMapped;
          m.answer.mode = kMapped;
          TUTTI_TRY(openSegment(spec.peer, d.spareName, d.bytes, &m.host, &m.dev));
          shm_unlink(d.shmName);  // the page of the FIFO not taken (its receiver unlinks it too)
          return connected(spec, m);
        }
        if (e != cudaSuccess) {
          return cudaFailed("opening rank " + std::to_string(spec.peer) +
                                "'s FIFO with cudaIpcOpenMemHandle (NCCL_P2P_DISABLE=1 goes "
                                "through host memory instead)",
                            e);
        }
        m.mode = kDevice;
        if (d.mode == kEither) {
          m.answer.mode = kDevice;
          shm_unlink(d.spareName);  // the segment not taken (its receiver unlinks it too)
        }
        m.dev = static_cast<char*>(p);
        m.ipcOpened = true;
        void* page = nullptr;
        char* dev = nullptr;
        Status opened =
            openSegment(spec.peer, d.shmName, P2pConnection::kBrokenPageBytes, &page, &dev);
        if (!opened.ok()) {
          cudaIpcCloseMemHandle(p);
          return opened;
        }
        m.brokenPage = static_cast<uint32_t*>(page);
        m.brokenDev = reinterpret_cast<uint32_t*>(dev);
      }
    } else if (d.mode == kMapped) {
      TUTTI_TRY(openSegment(spec.peer, d.shmName, d.bytes, &m.host, &m.dev));
    } else {
      return internalError("p2p: rank " + std::to_string(spec.peer) +
                           " sent a descriptor of unknown mode " + std::to_string(d.mode));
    }
    return connected(spec, m);
  }

 private:
  // The sender's end, once it holds the FIFO: its step, in its own GPU memory
  // (dev::DevConn::step).
  Result<std::unique_ptr<Connection>> connected(const ConnSpec& spec, P2pConnection::Memory m) {
    void* step = nullptr;
    cudaError_t e = cudaMalloc(&step, 64);
    Status z = e == cudaSuccess ? zero(step, 64) : cudaFailed("cudaMalloc", e);
    if (!z.ok()) {
      if (step) cudaFree(step);
      P2pConnection dropped(spec, llSlotBytes_, m);  // gives back what m holds
      return z;
    }
    m.ownStep = static_cast<uint64_t*>(step);
    return std::unique_ptr<Connection>(new P2pConnection(spec, llSlotBytes_, m));
  }

  // A sender whose IPC open of a FIFO on a GPU the receiver could not see failed. Where the
  // two GPUs cannot reach each other that is the hardware (said at INFO, once per peer);
  // anything else is worth a warning, once per communicator.
  void noteNoIpc(int r, cudaError_t e) {
    noIpc_.insert(r);
    if (e == cudaErrorPeerAccessUnsupported) {
      TUTTI_INFO(log::kInit,
                 "rank %d: rank %d's GPU (bus id %s) cannot be reached from this one (%s): "
                 "links to it go through mapped host memory",
                 comm_.rank(), r, peer(r).busId, cudaGetErrorString(e));
    } else if (!warnedIpc_) {
      warnedIpc_ = true;
      TUTTI_WARN(
          "rank %d: cannot open rank %d's FIFO in GPU memory (bus id %s) with "
          "cudaIpcOpenMemHandle: %s; links to it go through mapped host memory, slower than "
          "GPU memory",
          comm_.rank(), r, peer(r).busId, cudaGetErrorString(e));
    }
  }

  const PeerInfo& me() const { return comm_.peers()[size_t(comm_.rank())]; }
  const PeerInfo& peer(int r) const { return comm_.peers()[size_t(r)]; }
  bool sameProcess(int r) const { return peer(r).pid == me().pid && peer(r).pidNs == me().pidNs; }
  // The peer's rank runs on this rank's GPU (same host, bus id and UUID: tutti::sameGpu).
  bool sameGpu(int r) const { return tutti::sameGpu(peer(r), me()); }

  Status useDevice() const {
    if (cudaError_t e = cudaSetDevice(comm_.cudaDev()); e != cudaSuccess)
      return cudaFailed("cudaSetDevice(" + std::to_string(comm_.cudaDev()) + ")", e);
    return Status::Ok();
  }

  // GPU memory (kDevice) unless p2p is disabled on either end or the sender's GPU cannot reach
  // the receiver's (kMapped). Decided by the receiver from facts both sides share (bus ids, the
  // sender's NCCL_P2P_DISABLE in its PeerInfo), and carried to the sender -- but for a sender
  // on a GPU this process cannot see (kEither), which the sender decides.
  Mode choiceWith(int r) const {
    if (p2pDisabled_ || peer(r).device.p2pDisabled) return kMapped;
    // One bus id: the same GPU, or two MIG instances of it, which reach each other only
    // through host memory (no IPC or peer access between instances).
    if (strcmp(peer(r).busId, me().busId) == 0)
      return tutti::sameGpu(peer(r), me()) ? kDevice : kMapped;
    const int other = deviceOfBus(peer(r).busId);
    // CUDA cannot say whether a GPU it does not show reaches this one, but the sender's IPC
    // open can: it needs the way from its GPU to this one alone. Once a sender took the spare,
    // its later links are mapped (a rank of this process sees what this rank sees).
    if (other < 0) return sameProcess(r) || tookSpare_.count(r) ? kMapped : kEither;
    // The sender (other) writes into this rank's FIFO and reads its head: its GPU must reach
    // this one (both ways asked: topologies where only one way works are not worth the risk).
    int there = 0, back = 0;
    if (cudaDeviceCanAccessPeer(&there, other, comm_.cudaDev()) != cudaSuccess ||
        cudaDeviceCanAccessPeer(&back, comm_.cudaDev(), other) != cudaSuccess) {
      cudaGetLastError();
      return kMapped;
    }
    return there != 0 && back != 0 ? kDevice : kMapped;
  }

  Status enablePeerAccess(int r) const {
    const int other = deviceOfBus(peer(r).busId);
    if (other < 0 || other == comm_.cudaDev()) return Status::Ok();
    cudaError_t e = cudaDeviceEnablePeerAccess(other, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();
      return Status::Ok();
    }
    if (e != cudaSuccess)
      return cudaFailed("cudaDeviceEnablePeerAccess(" + std::to_string(other) + ")", e);
    return Status::Ok();
  }

  // A name for a new segment of this process: /tutti-<what>-<pid>-<comm hash>-<rank>-<counter>
  // (the rank too: ranks in other pid namespaces, containers, may share /dev/shm and a pid).
  void nameSegment(const char* what, char* name, size_t size) const {
    static std::atomic<uint32_t> counter{0};
    snprintf(name, size, "/tutti-%s-%d-%08x-%d-%u", what, int(getpid()),
             unsigned(comm_.commHash() & 0xffffffffu), comm_.rank(), counter.fetch_add(1));
  }
  // Creates a POSIX shared-memory segment of `bytes` (zero) and returns its descriptor.
  static Result<int> createSegment(const char* name, size_t bytes) {
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return errnoStatus(std::string("p2p: shm_open ") + name, errno);
    if (ftruncate(fd, off_t(bytes)) != 0) {
      int err = errno;
      close(fd);
      shm_unlink(name);
      return errnoStatus(std::string("p2p: cannot size ") + name, err);
    }
    return fd;
  }
  // Opens the peer's segment, maps and registers it, and unlinks its name (both sides have it).
  static Status openSegment(int peer, const char* name, size_t bytes, void** host, char** dev) {
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) {
      return errnoStatus("p2p: opening rank " + std::to_string(peer) + "'s " + name, errno);
    }
    Status s = mapRegistered(fd, bytes, host, dev);
    close(fd);
    shm_unlink(name);
    return s;
  }
  // Maps a segment into this process (not registered).
  static Result<void*> mapShared(int fd, size_t bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return errnoStatus("p2p: mmap", errno);
    return p;
  }
  // Maps a segment and registers it with CUDA as mapped memory: its host and device addresses.
  static Status mapRegistered(int fd, size_t bytes, void** host, char** dev) {
    TUTTI_ASSIGN(p, mapShared(fd, bytes));
    if (Status s = P2pConnection::registerMapped(p, bytes, dev); !s.ok()) {
      munmap(p, bytes);
      return s;
    }
    *host = p;
    return Status::Ok();
  }

  // Zeroes device memory and waits for it, on a stream of its own (cudaMemset may return
  // before the zeros land, queued behind the application's work).
  static Status zero(void* p, size_t bytes) {
    cudaStream_t s;
    if (cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess)
      return cudaFailed("cudaStreamCreate", e);
    cudaError_t e = cudaMemsetAsync(p, 0, bytes, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    return e == cudaSuccess ? Status::Ok() : cudaFailed("zeroing a FIFO", e);
  }

  Comm& comm_;
  bool p2pDisabled_;
  bool warnedIpc_ = false;
  std::set<int> noIpc_;      // sender: peers whose FIFOs it could not open
  std::set<int> tookSpare_;  // receiver: peers whose senders took the spare
  size_t llSlotBytes_;
};

}  // namespace

std::unique_ptr<Transport> makeP2pTransport(Comm& comm) {
  return std::make_unique<P2pTransport>(comm);
}

}  // namespace tutti::transport
