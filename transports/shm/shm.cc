// shm: ranks on one host. The receiver creates the FIFO (control block, kSlots slots, kSteps
// cells for small payloads: transport.h) in a
// POSIX shared-memory segment, mode 0600, and sends its name; the sender maps it and unlinks
// it at once, so from then on nothing is left in /dev/shm even if both processes crash. The
// receiver unlinks it too when it is freed, in case the sender never came.
//
// Single copy: a sender may publish a slot whose payload stays in its own buffer (FifoCtrl::
// src); it is then copied straight to where the receiver needs it -- with memcpy between
// threads of one process, with process_vm_readv / process_vm_writev (cross-memory attach, as
// Open MPI's vader uses) between processes -- in pieces that the receiver and a waiting
// sender both take (ShmHelp), instead of the sender copying in and the receiver copying out.
// By default adaptive: a big payload goes through the slots while copying into them runs
// fast, and by single copy for a while once the median of 8 such copies ran slow
// (ShmConnection::sendFrom); TUTTI_SHM_SINGLE_COPY=1 always, =0 never. Only for payloads of
// at least TUTTI_SHM_SINGLE_COPY_MIN bytes (a system call costs about what a few KiB of
// copying do), and only where the sender could read the receiver's memory when the link was
// made.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <new>
#include <optional>
#include <string>

#include "kernels/cpu/simd.h"
#include "runtime/comm.h"
#include "runtime/env.h"
#include "runtime/log.h"
#include "transports/shm/shm_connection.h"
#include "transports/transport.h"

namespace tutti::transport {
namespace {

struct ShmDesc {
  char name[64];
  uint64_t bytes;
  uint64_t slotBytes;
  // A word in the receiver's memory and its value: the sender tries to read it to learn
  // whether single copy works between the two processes.
  uint64_t probeAddr;
  uint64_t probeValue;
};

// What the probe reads: a value unlikely to sit at a wrong address by chance.
const uint64_t kProbeValue = 0x7475747469434d41ull ^ uint64_t(getpid());
static_assert(sizeof(ShmDesc) <= sizeof(Descriptor));

class ShmTransport : public Transport {
 public:
  explicit ShmTransport(Comm& comm) : comm_(comm) {
    // Unset: adaptive (ShmConnection::sendFrom). Always on was slower with 2 ranks on this
    // 2-core VM while its vCPUs shared a die (2 MiB broadcast 190-280 us against 146-182 us
    // with slots; 32 MiB 6.3-6.8 ms against 5.3-5.4 ms): the two-copy pipeline keeps both
    // cores copying, single copy leaves the sender idle. When they did not share one, slots
    // were 2-5x slower.
    const std::optional<std::string> mode = env::getString("TUTTI_SHM_SINGLE_COPY");
    adaptive_ = !mode || mode->empty();
    singleCopy_ = adaptive_ || env::getBool("TUTTI_SHM_SINGLE_COPY", false);
    slowGBps_ = env::getDouble("TUTTI_SHM_SLOW_GBPS", 5.0);
    minBytes_ = size_t(std::max<int64_t>(1, env::getInt("TUTTI_SHM_SINGLE_COPY_MIN", 64 << 10)));
  }
  const char* name() const override { return "shm"; }

  bool canConnect(const PeerInfo& me, const PeerInfo& peer) const override {
    return me.hostHash == peer.hostHash;
  }

  Result<std::unique_ptr<Connection>> setupRecv(const ConnSpec& spec, Descriptor* out) override {
    static std::atomic<uint32_t> counter{0};
    ShmDesc d{};
    // The rank too: ranks in other pid namespaces (containers) may share /dev/shm and a pid.
    snprintf(d.name, sizeof(d.name), "/tutti-%d-%08x-%d-%u", static_cast<int>(getpid()),
             static_cast<unsigned>(comm_.commHash() & 0xffffffffu), comm_.rank(),
             counter.fetch_add(1));
    d.slotBytes = spec.slotBytes;
    d.bytes = segmentBytes(spec.slotBytes);
    int fd = shm_open(d.name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return errnoStatus(std::string("shm: shm_open ") + d.name, errno);
    if (ftruncate(fd, static_cast<off_t>(d.bytes)) != 0) {
      int err = errno;
      close(fd);
      shm_unlink(d.name);
      return errnoStatus(std::string("shm: cannot size ") + d.name + " (is /dev/shm full?)", err);
    }
    Result<void*> base = map(fd, d.bytes, d.name, populates(spec.peer, d.bytes));
    close(fd);
    if (!base.ok()) {
      shm_unlink(d.name);
      return base.status();
    }
    auto* ctrl = new (base.value()) FifoCtrl();
    ctrl->tail.store(0);
    ctrl->head.store(0);
    for (auto& s : ctrl->sizes) s.store(0);
    for (auto& s : ctrl->src) s.store(0);
    auto* help = new (static_cast<char*>(base.value()) + sizeof(FifoCtrl)) ShmHelp();
    for (int k = 0; k < kSteps; ++k) {
      help->dst[k].store(0), help->bytes[k].store(0), help->claim[k].store(0);
      help->done[k].store(0), help->piece[k].store(0);
    }
    help->senderMin.store(0);
    ctrl->broken.store(0);
    ctrl->magic = kShmMagic;
    d.probeAddr = reinterpret_cast<uint64_t>(&kProbeValue);
    d.probeValue = kProbeValue;
    memcpy(out->bytes, &d, sizeof(d));
    const PeerInfo& p = comm_.peers()[static_cast<size_t>(spec.peer)];
    auto conn = std::make_unique<ShmConnection>(spec, comm_.rank(), base.value(), d.bytes, d.name,
                                                true, p.pid, checkPid(p));
    // The receiving side copies whatever slots the sender publishes by address, whatever this
    // rank's own TUTTI_SHM_SINGLE_COPY says (that governs what it sends): a sender that has it
    // on, and could read this process when it connected, may publish any payload from its
    // minimum by address, bigger than a slot too. Below the published minimum (none: no
    // single copy there) the receiver posts no claim, so this costs nothing otherwise.
    conn->enableSingleCopy(sameProcess(p), 0, false, slowGBps_);
    return std::unique_ptr<Connection>(std::move(conn));
  }

  Result<std::unique_ptr<Connection>> connectSend(const ConnSpec& spec,
                                                  const Descriptor& in) override {
    ShmDesc d;
    memcpy(&d, in.bytes, sizeof(d));
    d.name[sizeof(d.name) - 1] = 0;
    if (d.slotBytes != spec.slotBytes || d.bytes != segmentBytes(spec.slotBytes)) {
      return invalidUsage("shm: rank " + std::to_string(spec.peer) + " uses a slot size of " +
                          std::to_string(d.slotBytes) + " bytes, this rank " +
                          std::to_string(spec.slotBytes) + " (NCCL_BUFFSIZE must match)");
    }
    int fd = shm_open(d.name, O_RDWR, 0);
    if (fd < 0)
      return errnoStatus(
          std::string("shm: opening rank ") + std::to_string(spec.peer) + "'s " + d.name, errno);
    Result<void*> base = map(fd, d.bytes, d.name, populates(spec.peer, d.bytes));
    close(fd);
    shm_unlink(d.name);  // both sides have it mapped now
    if (!base.ok()) return base.status();
    if (static_cast<FifoCtrl*>(base.value())->magic != kShmMagic) {
      munmap(base.value(), d.bytes);
      return internalError(std::string("shm: segment ") + d.name + " is not a tutti FIFO");
    }
    const PeerInfo& p = comm_.peers()[static_cast<size_t>(spec.peer)];
    auto conn = std::make_unique<ShmConnection>(spec, comm_.rank(), base.value(), d.bytes, d.name,
                                                false, p.pid, checkPid(p));
    uint64_t byAddress = UINT64_MAX;
    if (singleCopy_) {
      const bool same = sameProcess(p);
      if (same || (checkPid(p) && canReach(p, d))) {
        byAddress = senderMinBytes(same);
        conn->enableSingleCopy(same, byAddress, adaptive_, slowGBps_);
      } else {
        TUTTI_INFO(log::kInit, "rank %d -> rank %d: shm without single copy (cannot read pid %lld)",
                   comm_.rank(), spec.peer, static_cast<long long>(p.pid));
      }
    }
    conn->publishSenderMin(byAddress);
    return std::unique_ptr<Connection>(std::move(conn));
  }

 private:
  // The FIFOs between ring neighbours (every FIFO with two ranks), of the default size (1 MiB)
  // or a few, are populated at once on both sides: their slots' first touches, a page fault
  // per 4 KiB on each side, otherwise land on the first operations that use them (two ranks,
  // 256 KiB all-gathers through the slots: 150-250 us each until all 8 slots were touched, 13
  // after), which also misleads the engine's timing of its choices (TwoWayTuner). Not every
  // FIFO: with n(n-1) flat links that would commit every slot of every link (/dev/shm is 64 MiB
  // in a default container).
  static constexpr size_t kPopulateMaxBytes = 8 << 20;
  bool populates(int peer, size_t bytes) const {
    const int n = comm_.nranks(), r = comm_.rank();
    return bytes <= kPopulateMaxBytes && (peer == (r + 1) % n || peer == (r + n - 1) % n);
  }
  static Result<void*> map(int fd, size_t bytes, const char* name, bool populate) {
    const int flags = MAP_SHARED | (populate ? MAP_POPULATE : 0);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, fd, 0);
    if (p == MAP_FAILED) return errnoStatus(std::string("shm: mmap ") + name, errno);
    return p;
  }
  // Between threads a memcpy costs no system call: single copy from 4 KiB.
  size_t senderMinBytes(bool sameProcess) const {
    return sameProcess ? std::min<size_t>(minBytes_, 4096) : minBytes_;
  }
  const PeerInfo& me() const { return comm_.peers()[static_cast<size_t>(comm_.rank())]; }
  bool sameProcess(const PeerInfo& p) const { return p.pid == me().pid && p.pidNs == me().pidNs; }
  // Whether this process can read the peer's memory (and so, by the same rule, it ours).
  static bool canReach(const PeerInfo& p, const ShmDesc& d) {
    uint64_t got = 0;
    iovec local{&got, sizeof(got)};
    iovec remote{reinterpret_cast<void*>(d.probeAddr), sizeof(got)};
    return process_vm_readv(static_cast<pid_t>(p.pid), &local, 1, &remote, 1, 0) ==
               ssize_t(sizeof(got)) &&
           got == d.probeValue;
  }
  bool checkPid(const PeerInfo& p) const {
    // (Not canWatchProcess: an shm link already proves one kernel, boot id or not.)
    const PeerInfo& me = comm_.peers()[static_cast<size_t>(comm_.rank())];
    return p.pid != me.pid && p.pidNs == me.pidNs && me.pidNs != 0;
  }
  Comm& comm_;
  bool singleCopy_, adaptive_;
  double slowGBps_;
  size_t minBytes_;
};

}  // namespace

std::unique_ptr<Transport> makeShmTransport(Comm& comm) {
  return std::make_unique<ShmTransport>(comm);
}

}  // namespace tutti::transport
