#include "transports/shm/area.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tutti::transport {
namespace {

constexpr uint64_t kAreaMagic = 0x61657261'74747574ull;  // "tuttarea"

struct Head {
  uint64_t magic, nranks, slots, chunk;
};

size_t pageBytes() { return size_t(sysconf(_SC_PAGESIZE)); }

}  // namespace

size_t ShmArea::dataOffFor(int nranks, int slots) {
  const size_t page = pageBytes(), lines = 3 + size_t(slots) + size_t(nranks);
  return (lines * kLine + page - 1) / page * page;
}

size_t ShmArea::bytesFor(int nranks, int slots, size_t chunkBytes) {
  return dataOffFor(nranks, slots) + size_t(slots) * chunkBytes;
}

Result<std::unique_ptr<ShmArea>> ShmArea::create(const std::string& name, int nranks, int slots,
                                                 size_t chunkBytes) {
  const size_t bytes = bytesFor(nranks, slots, chunkBytes);
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return errnoStatus("shm: shm_open " + name, errno);
  // posix_fallocate, not ftruncate: a full /dev/shm fails here, not with SIGBUS on a first touch.
  int err = posix_fallocate(fd, 0, off_t(bytes));
  void* base = err ? MAP_FAILED : mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (!err && base == MAP_FAILED) err = errno;
  close(fd);
  if (err) {
    shm_unlink(name.c_str());
    return errnoStatus("shm: broadcast area " + name + " (" + std::to_string(bytes) + " bytes)",
                       err);
  }
  std::unique_ptr<ShmArea> a(new ShmArea(name, base, bytes, nranks, slots, chunkBytes));
  // The segment starts zeroed: every counter at 0. The head goes last, for open() to check.
  *a->at<Head>(0) = Head{kAreaMagic, uint64_t(nranks), uint64_t(slots), chunkBytes};
  return a;
}

Result<std::unique_ptr<ShmArea>> ShmArea::open(const std::string& name, int nranks, int slots,
                                               size_t chunkBytes) {
  const size_t bytes = bytesFor(nranks, slots, chunkBytes);
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return errnoStatus("shm: shm_open " + name, errno);
  // Mapped as it is (never past its end), then checked against what this rank expects.
  struct stat st {};
  int err = fstat(fd, &st) != 0 ? errno : size_t(st.st_size) < sizeof(Head) ? EINVAL : 0;
  void* base = err ? MAP_FAILED
                   : mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (!err && base == MAP_FAILED) err = errno;
  close(fd);
  if (base == MAP_FAILED) return errnoStatus("shm: mapping broadcast area " + name, err);
  std::unique_ptr<ShmArea> a(
      new ShmArea(name, base, size_t(st.st_size), nranks, slots, chunkBytes));
  a->linked_ = false;  // rank 0 unlinks it
  const Head& h = *a->at<Head>(0);
  if (h.magic != kAreaMagic || h.nranks != uint64_t(nranks) || h.slots != uint64_t(slots) ||
      h.chunk != chunkBytes || size_t(st.st_size) != bytes) {
    return invalidUsage("shm: broadcast area " + name + " has " + std::to_string(h.slots) +
                        " slots of " + std::to_string(h.chunk) + " bytes for " +
                        std::to_string(h.nranks) + " ranks, this rank expects " +
                        std::to_string(slots) + " of " + std::to_string(chunkBytes) + " for " +
                        std::to_string(nranks) +
                        " (TUTTI_SHM_AREA_SLOTS and TUTTI_SHM_AREA_CHUNK must match)");
  }
  return a;
}

ShmArea::~ShmArea() {
  unlink();
  if (base_) munmap(base_, bytes_);
}

void ShmArea::unlink() {
  if (linked_) shm_unlink(name_.c_str());
  linked_ = false;
}

}  // namespace tutti::transport
