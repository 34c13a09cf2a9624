// shm: ranks on one host. The receiver creates the FIFO (control block + kSteps slots) in a
// POSIX shared-memory segment, mode 0600, and sends its name; the sender maps it and unlinks
// it at once, so from then on nothing is left in /dev/shm even if both processes crash. The
// receiver unlinks it too when it is freed, in case the sender never came.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <new>

#include "runtime/comm.h"
#include "runtime/log.h"
#include "transports/transport.h"

namespace tutti::transport {
namespace {

constexpr uint32_t kShmMagic = 0x73686d31;  // "shm1"

struct ShmDesc {
  char name[64];
  uint64_t bytes;
  uint64_t slotBytes;
};
static_assert(sizeof(ShmDesc) <= sizeof(Descriptor));

size_t segmentBytes(size_t slotBytes) { return sizeof(FifoCtrl) + kSteps * slotBytes; }

class ShmConnection : public Connection {
 public:
  ShmConnection(const ConnSpec& spec, void* base, size_t bytes, std::string name, bool owner,
                int64_t peerPid, bool checkPid)
      : base_(base),
        bytes_(bytes),
        name_(std::move(name)),
        owner_(owner),
        peerPid_(peerPid),
        checkPid_(checkPid),
        peer_(spec.peer) {
    fifo_.ctrl = static_cast<FifoCtrl*>(base);
    fifo_.slots = static_cast<char*>(base) + sizeof(FifoCtrl);
    fifo_.slotBytes = spec.slotBytes;
    fifo_.peer = spec.peer;
    fifo_.channel = spec.channel;
    fifo_.conn = this;
  }
  ~ShmConnection() override {
    if (owner_) shm_unlink(name_.c_str());  // ENOENT once the sender unlinked it: fine
    munmap(base_, bytes_);
  }
  Status health() const override {
    if (fifo_.ctrl->broken.load(std::memory_order_acquire)) {
      return remoteError("rank " + std::to_string(peer_) +
                         " left the operation (its communicator failed or was aborted)");
    }
    // A peer process that died cannot say so: check that it still exists (and is not a
    // zombie its parent has yet to reap). Only meaningful inside one pid namespace.
    if (checkPid_ && !processAlive(static_cast<pid_t>(peerPid_))) {
      return remoteError("rank " + std::to_string(peer_) + " (pid " + std::to_string(peerPid_) +
                         ", same host, shm) exited");
    }
    return Status::Ok();
  }

  static bool processAlive(pid_t pid) {
    if (kill(pid, 0) != 0 && errno == ESRCH) return false;
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
    FILE* f = fopen(path, "r");
    if (!f) return true;  // no /proc: trust kill()
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    const char* close = strrchr(buf, ')');  // the command name may contain anything
    return !(close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X'));
  }
  const char* transportName() const override { return "shm"; }

 private:
  void* base_;
  size_t bytes_;
  std::string name_;
  bool owner_;
  int64_t peerPid_;
  bool checkPid_;  // another process in our pid namespace
  int peer_;
};

class ShmTransport : public Transport {
 public:
  explicit ShmTransport(Comm& comm) : comm_(comm) {}
  const char* name() const override { return "shm"; }

  bool canConnect(const PeerInfo& me, const PeerInfo& peer) const override {
    return me.hostHash == peer.hostHash;
  }

  Result<std::unique_ptr<Connection>> setupRecv(const ConnSpec& spec, Descriptor* out) override {
    static std::atomic<uint32_t> counter{0};
    ShmDesc d{};
    snprintf(d.name, sizeof(d.name), "/tutti-%d-%08x-%u", static_cast<int>(getpid()),
             static_cast<unsigned>(comm_.commHash() & 0xffffffffu), counter.fetch_add(1));
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
    Result<void*> base = map(fd, d.bytes, d.name);
    close(fd);
    if (!base.ok()) {
      shm_unlink(d.name);
      return base.status();
    }
    auto* ctrl = new (base.value()) FifoCtrl();
    ctrl->tail.store(0);
    ctrl->head.store(0);
    for (auto& s : ctrl->sizes) s.store(0);
    ctrl->broken.store(0);
    ctrl->magic = kShmMagic;
    memcpy(out->bytes, &d, sizeof(d));
    const PeerInfo& p = comm_.peers()[static_cast<size_t>(spec.peer)];
    return std::unique_ptr<Connection>(std::make_unique<ShmConnection>(
        spec, base.value(), d.bytes, d.name, true, p.pid, checkPid(p)));
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
    Result<void*> base = map(fd, d.bytes, d.name);
    close(fd);
    shm_unlink(d.name);  // both sides have it mapped now
    if (!base.ok()) return base.status();
    if (static_cast<FifoCtrl*>(base.value())->magic != kShmMagic) {
      munmap(base.value(), d.bytes);
      return internalError(std::string("shm: segment ") + d.name + " is not a tutti FIFO");
    }
    const PeerInfo& p = comm_.peers()[static_cast<size_t>(spec.peer)];
    return std::unique_ptr<Connection>(std::make_unique<ShmConnection>(
        spec, base.value(), d.bytes, d.name, false, p.pid, checkPid(p)));
  }

 private:
  static Result<void*> map(int fd, size_t bytes, const char* name) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return errnoStatus(std::string("shm: mmap ") + name, errno);
    return p;
  }
  bool checkPid(const PeerInfo& p) const {
    const PeerInfo& me = comm_.peers()[static_cast<size_t>(comm_.rank())];
    return p.pid != me.pid && p.pidNs == me.pidNs && me.pidNs != 0;
  }
  Comm& comm_;
};

}  // namespace

std::unique_ptr<Transport> makeShmTransport(Comm& comm) {
  return std::make_unique<ShmTransport>(comm);
}

}  // namespace tutti::transport
