// p2p: FIFOs for GPU ranks on one host, which device kernels read and write directly.
//   device mode  -- the receiver allocates the FIFO (control block, Simple slots, LL slots) in
//                   its GPU's memory; a sender in the same process uses the pointer (enabling
//                   peer access when the GPUs differ), one in another process opens it with
//                   CUDA IPC. Ranks that share one GPU use this too: it is how the whole GPU
//                   path runs on a one-GPU machine.
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
#include <vector>

#include "runtime/comm.h"
#include "runtime/cuda_scope.h"
#include "runtime/env.h"
#include "runtime/log.h"
#include "transports/transport.h"

namespace tutti::transport {
namespace {

enum Mode : int32_t { kDevice = 1, kMapped = 2 };

// Broken words of same-process links: one per FIFO, shared by its two ends (both connections
// of this process). A word goes back to a pool when the last of them goes, never to CUDA: a
// free waits for the GPU, and the last holder may be the peer's thread while a kernel on that
// GPU waits for that very thread. The pool grows by pinned pages of 64 words; a word's device
// address (the same for every GPU: the page is portable) is looked up once, with its page.
class BrokenWords {
 public:
  struct Word {
    uint32_t* host = nullptr;
    uint32_t* dev = nullptr;
  };
  // A word, zero, with one holder (the receiver); host nullptr (and *err) if none could be
  // had. A new page is made outside the lock (CUDA calls may wait; a drop must not).
  static Word make(cudaError_t* err) {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu());
        if (!pool().empty()) {
          const Word w = pool().back();
          pool().pop_back();
          __atomic_store_n(w.host, 0u, __ATOMIC_RELEASE);
          held()[w.host] = Held{1, w.dev, nullptr};
          return w;
        }
      }
      void* p = nullptr;
      void* d = nullptr;
      *err = cudaHostAlloc(&p, kPage, cudaHostAllocMapped | cudaHostAllocPortable);
      if (*err != cudaSuccess) return {};
      *err = cudaHostGetDevicePointer(&d, p, 0);
      if (*err != cudaSuccess) {
        cudaFreeHost(p);
        return {};
      }
      std::lock_guard<std::mutex> lock(mu());
      for (size_t off = kPage; off >= kStride; off -= kStride) {  // lowest address first out
        pool().push_back(Word{reinterpret_cast<uint32_t*>(static_cast<char*>(p) + off - kStride),
                              reinterpret_cast<uint32_t*>(static_cast<char*>(d) + off - kStride)});
      }
    }
  }
  // The sender holds it too; host nullptr if the receiver let it go already.
  static Word hold(uint32_t* host) {
    std::lock_guard<std::mutex> lock(mu());
    auto it = held().find(host);
    if (it == held().end()) return {};
    ++it->second.refs;
    return Word{host, it->second.dev};
  }
  // Lets a holder go. The receiver passes the FIFO it allocated: whichever end lets go last
  // gets it back to free (nullptr otherwise), so that a FIFO of two ranks of one process stays
  // while either end's communicator lives -- the other's kernel may still write into it (an
  // idle rank aborted while its peer's kernel sends to it).
  static char* drop(uint32_t* host, char* fifo = nullptr) {
    std::lock_guard<std::mutex> lock(mu());
    auto it = held().find(host);
    if (it == held().end()) return fifo;
    if (fifo) it->second.fifo = fifo;
    if (--it->second.refs > 0) return nullptr;
    char* last = it->second.fifo;
    pool().push_back(Word{host, it->second.dev});
    held().erase(it);
    return last;
  }

 private:
  static constexpr size_t kPage = 4096;
  static constexpr size_t kStride = 64;  // a word per cache line
  struct Held {
    int refs;
    uint32_t* dev;
    char* fifo;  // the receiver's FIFO once the receiver let go (freed by the last holder)
  };
  // Never destroyed: a communicator may be destroyed during exit, after function statics.
  static std::mutex& mu() {
    static auto* m = new std::mutex;
    return *m;
  }
  static std::map<uint32_t*, Held>& held() {
    static auto* h = new std::map<uint32_t*, Held>;
    return *h;
  }
  static std::vector<Word>& pool() {
    static auto* v = new std::vector<Word>;
    return *v;
  }
};

// FIFOs in GPU memory that an abort kept because senders in other processes may still write
// into them (keepIfOtherProcessWrites): a later communicator's p2p links free those kept long
// enough that every such sender has seen the broken word (its kernel stops at its next wait,
// microseconds on; a kernel that starts later waits at once, for slots it never gets). So
// repeated aborts (a framework's teardown, an in-process restart) do not pile them up.
class KeptFifos {
 public:
  static void keep(char* dev, size_t bytes) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return;  // (not freed, then)
    std::lock_guard<std::mutex> lock(mu());
    list().push_back({dev, device, bytes, std::chrono::steady_clock::now()});
  }
  // Frees those kept TUTTI_ABORT_KEEP_S (10 s unless set) or more: the bytes.
  static size_t freeOld() {
    static const double keepS = env::getDouble("TUTTI_ABORT_KEEP_S", 10);
    const auto now = std::chrono::steady_clock::now();
    std::vector<Kept> old;
    {
      std::lock_guard<std::mutex> lock(mu());
      auto& l = list();
      for (size_t i = 0; i < l.size();) {
        if (std::chrono::duration<double>(now - l[i].since).count() >= keepS) {
          old.push_back(l[i]);
          l[i] = l.back();
          l.pop_back();
        } else {
          ++i;
        }
      }
    }
    size_t bytes = 0;
    CaptureModeRelaxed relaxed;  // another thread may be capturing in the global mode
    for (const Kept& k : old) {
      // (The guard clears a failure of ours, not an error the application has yet to read.)
      DeviceGuard guard(k.device);
      if (cudaFree(k.dev) == cudaSuccess) bytes += k.bytes;
    }
    return bytes;
  }

 private:
  struct Kept {
    char* dev;
    int device;
    size_t bytes;
    std::chrono::steady_clock::time_point since;
  };
  static std::mutex& mu() {
    static std::mutex* m = new std::mutex;  // never destroyed: links may go during exit
    return *m;
  }
  static std::vector<Kept>& list() {
    static std::vector<Kept>* l = new std::vector<Kept>;
    return *l;
  }
};

struct P2pDesc {
  uint64_t bytes;
  uint64_t slotBytes;
  uint64_t llSlotBytes;
  uint64_t devPtr;     // device mode, same process
  uint64_t brokenPtr;  // device mode, same process: the broken word (BrokenWords)
  int32_t mode;
  int32_t pad;
  cudaIpcMemHandle_t ipc;  // device mode, other processes
  char shmName[56];        // mapped mode
};
static_assert(sizeof(P2pDesc) <= sizeof(Descriptor));

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
    if (deviceModeWith(spec.peer)) {
      d.mode = m.mode = kDevice;
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
    if (d.mode == kDevice) {
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
        if (cudaError_t e = cudaIpcOpenMemHandle(&p, d.ipc, cudaIpcMemLazyEnablePeerAccess);
            e != cudaSuccess) {
          return cudaFailed("opening rank " + std::to_string(spec.peer) +
                                "'s FIFO with cudaIpcOpenMemHandle (NCCL_P2P_DISABLE=1 goes "
                                "through host memory instead)",
                            e);
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
    // The sender's step lives in its own GPU memory (dev::DevConn::step).
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

 private:
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

  // GPU memory unless p2p is disabled on either end or the sender's GPU cannot reach the
  // receiver's. Decided by the receiver from facts both sides share (bus ids, the sender's
  // NCCL_P2P_DISABLE in its PeerInfo), and carried to the sender.
  bool deviceModeWith(int r) const {
    if (p2pDisabled_ || peer(r).device.p2pDisabled) return false;
    // One bus id: the same GPU, or two MIG instances of it, which reach each other only
    // through host memory (no IPC or peer access between instances).
    if (strcmp(peer(r).busId, me().busId) == 0) return tutti::sameGpu(peer(r), me());
    const int other = deviceOfBus(peer(r).busId);
    if (other < 0 && !warnedInvisible_) {
      warnedInvisible_ = true;  // once per communicator: every peer's GPU is alike, as a rule
      TUTTI_WARN(
          "rank %d: rank %d's GPU (bus id %s) is not visible in this process "
          "(CUDA_VISIBLE_DEVICES?), so their links go through mapped host memory, slower than "
          "GPU memory; let each process see the GPUs of the ranks on its host",
          comm_.rank(), r, peer(r).busId);
    }
    // The sender (other) writes into this rank's FIFO and reads its head: its GPU must reach
    // this one (both ways asked: topologies where only one way works are not worth the risk).
    int there = 0, back = 0;
    if (other < 0 || cudaDeviceCanAccessPeer(&there, other, comm_.cudaDev()) != cudaSuccess ||
        cudaDeviceCanAccessPeer(&back, comm_.cudaDev(), other) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return there != 0 && back != 0;
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

  // A name for a new segment of this process: /tutti-<what>-<pid>-<comm hash>-<counter>.
  void nameSegment(const char* what, char* name, size_t size) const {
    static std::atomic<uint32_t> counter{0};
    snprintf(name, size, "/tutti-%s-%d-%08x-%u", what, int(getpid()),
             unsigned(comm_.commHash() & 0xffffffffu), counter.fetch_add(1));
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
  // Maps a segment and registers it with CUDA as mapped memory: its host and device addresses.
  static Status mapRegistered(int fd, size_t bytes, void** host, char** dev) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return errnoStatus("p2p: mmap", errno);
    if (cudaError_t e =
            cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
        e != cudaSuccess) {
      munmap(p, bytes);
      return cudaFailed("cudaHostRegister of shared memory", e);
    }
    void* d = nullptr;
    if (cudaError_t e = cudaHostGetDevicePointer(&d, p, 0); e != cudaSuccess) {
      cudaHostUnregister(p);
      munmap(p, bytes);
      return cudaFailed("cudaHostGetDevicePointer", e);
    }
    *host = p;
    *dev = static_cast<char*>(d);
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
  mutable bool warnedInvisible_ = false;
  size_t llSlotBytes_;
};

}  // namespace

std::unique_ptr<Transport> makeP2pTransport(Comm& comm) {
  return std::make_unique<P2pTransport>(comm);
}

}  // namespace tutti::transport
