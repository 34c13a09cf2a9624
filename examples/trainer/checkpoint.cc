#include "examples/trainer/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace trainer {
namespace {

constexpr char kMagic[8] = {'T', 'U', 'T', 'T', 'I', 'C', 'K', 'P'};
// Version 2 records the training set's size (the step's place in an epoch depends on it) and
// checksums the header too; version 3 adds the optimizer's settings after the header (Settings);
// versions 1 and 2 still load.
constexpr uint32_t kVersion = 3;

// Fixed-width, little-endian on every machine this runs on (x86-64, aarch64).
struct Header {
  char magic[8];
  uint32_t version;
  uint32_t ndims;
  int64_t step;
  int64_t global_batch;
  uint64_t seed;
  uint64_t nparams;
  uint32_t momentum_started;
  uint32_t train_samples;  // version 2 (0 in version 1)
  uint64_t checksum;       // FNV-1a over the header (this field 0; version 1: not), dims, arrays
};

// Version 3: right after the header, inside the checksum.
struct Settings {
  double lr;
  double momentum;
  double weight_decay;
  uint32_t bf16_grads;
  uint32_t reserved;
};

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

uint64_t payloadChecksum(const Checkpoint& ck, const Header* header, const Settings* settings) {
  uint64_t h = 0xcbf29ce484222325ull;
  if (header) {
    Header zeroed = *header;
    zeroed.checksum = 0;
    h = fnv1a(h, &zeroed, sizeof zeroed);
  }
  if (settings) h = fnv1a(h, settings, sizeof *settings);
  h = fnv1a(h, ck.dims.data(), ck.dims.size() * sizeof(int));
  h = fnv1a(h, ck.params.data(), ck.params.size() * sizeof(float));
  return fnv1a(h, ck.momentum.data(), ck.momentum.size() * sizeof(float));
}

// Where a checkpoint is written before it is renamed into place.
std::string tmpPath(const std::string& path) { return path + ".tmp." + std::to_string(getpid()); }

bool writeAll(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= size_t(w);
  }
  return true;
}

}  // namespace

bool checkpointWritable(const std::string& path, std::string* error) {
  const std::string tmp = tmpPath(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    *error = "cannot write the checkpoint " + path + ": " + strerror(errno);
    return false;
  }
  ::close(fd);
  ::unlink(tmp.c_str());
  return true;
}

bool saveCheckpoint(const std::string& path, const Checkpoint& ck, std::string* error) {
  if (ck.momentum.size() != ck.params.size() || ck.dims.size() > kMaxCheckpointLayers) {
    *error = "internal: inconsistent checkpoint contents";
    return false;
  }
  Header h{};
  memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.ndims = uint32_t(ck.dims.size());
  h.step = ck.step;
  h.global_batch = ck.global_batch;
  h.seed = ck.seed;
  h.nparams = ck.params.size();
  h.momentum_started = ck.momentum_started ? 1 : 0;
  h.train_samples = uint32_t(ck.train_samples);
  Settings set{};
  set.lr = ck.lr;
  set.momentum = ck.momentum_factor;
  set.weight_decay = ck.weight_decay;
  set.bf16_grads = ck.bf16_grads ? 1 : 0;
  h.checksum = payloadChecksum(ck, &h, &set);
  // A crash mid-write must never leave a torn checkpoint under the real name.
  std::string tmp = tmpPath(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    *error = "cannot write the checkpoint " + path + " (its temporary file " + tmp +
             "): " + strerror(errno);
    return false;
  }
  bool ok = writeAll(fd, &h, sizeof h) && writeAll(fd, &set, sizeof set) &&
            writeAll(fd, ck.dims.data(), ck.dims.size() * sizeof(int)) &&
            writeAll(fd, ck.params.data(), ck.params.size() * sizeof(float)) &&
            writeAll(fd, ck.momentum.data(), ck.momentum.size() * sizeof(float)) &&
            ::fsync(fd) == 0;
  int saved = errno;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    if (ok) saved = errno;
    ::unlink(tmp.c_str());
    *error = "cannot write checkpoint " + path + ": " + strerror(saved);
    return false;
  }
  // The rename itself is durable only once the directory holding it is synced: without this a
  // power loss may bring back the previous checkpoint (or none) under the name.
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  // Some file systems (FUSE, some network ones) cannot sync a directory and say so: the file
  // itself is synced and in place, which is all they offer.
  if (dfd < 0 || (::fsync(dfd) != 0 && errno != EINVAL && errno != EBADF && errno != ENOTSUP)) {
    saved = errno;
    if (dfd >= 0) ::close(dfd);
    *error = "checkpoint " + path + " written, but syncing its directory " + dir +
             " failed: " + strerror(saved);
    return false;
  }
  ::close(dfd);
  return true;
}

bool loadCheckpoint(const std::string& path, Checkpoint* ck, std::string* error) {
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) {
    *error = "cannot open checkpoint " + path + ": " + strerror(errno);
    return false;
  }
  auto fail = [&](const std::string& why) {
    fclose(f);
    *error = "checkpoint " + path + ": " + why;
    return false;
  };
  Header h{};
  if (fread(&h, sizeof h, 1, f) != 1) return fail("too short for a header");
  if (memcmp(h.magic, kMagic, sizeof kMagic) != 0) return fail("not a tutti-train checkpoint");
  if (h.version < 1 || h.version > kVersion) {
    return fail("format version " + std::to_string(h.version) + ", this program reads " +
                std::to_string(kVersion));
  }
  if (h.ndims < 2 || h.ndims > kMaxCheckpointLayers || h.nparams == 0 || h.nparams > (1ull << 32)) {
    return fail("implausible header (" + std::to_string(h.ndims) + " layer widths, " +
                std::to_string(h.nparams) + " parameters)");
  }
  Settings set{};
  const bool hasSettings = h.version >= 3;
  if (hasSettings && fread(&set, sizeof set, 1, f) != 1) return fail("truncated");
  // The file's size must be what the header says before anything that large is allocated: a
  // corrupt count would otherwise ask for gigabytes.
  struct stat st {};
  const uint64_t want = sizeof h + (hasSettings ? sizeof set : 0) +
                        uint64_t(h.ndims) * sizeof(int) + 2 * h.nparams * sizeof(float);
  if (fstat(fileno(f), &st) != 0 || uint64_t(st.st_size) != want) {
    return fail(std::to_string(st.st_size) + " bytes where its header (" + std::to_string(h.ndims) +
                " layer widths, " + std::to_string(h.nparams) + " parameters) makes " +
                std::to_string(want) + " (truncated or corrupt)");
  }
  ck->dims.resize(h.ndims);
  ck->params.resize(h.nparams);
  ck->momentum.resize(h.nparams);
  if (fread(ck->dims.data(), sizeof(int), h.ndims, f) != h.ndims ||
      fread(ck->params.data(), sizeof(float), h.nparams, f) != h.nparams ||
      fread(ck->momentum.data(), sizeof(float), h.nparams, f) != h.nparams) {
    return fail("truncated");
  }
  if (fgetc(f) != EOF) return fail("trailing bytes after the momentum buffers");
  fclose(f);
  if (payloadChecksum(*ck, h.version >= 2 ? &h : nullptr, hasSettings ? &set : nullptr) !=
      h.checksum) {
    *error = "checkpoint " + path + ": checksum mismatch (the file is corrupt)";
    return false;
  }
  ck->step = h.step;
  ck->global_batch = h.global_batch;
  ck->seed = h.seed;
  ck->momentum_started = h.momentum_started != 0;
  ck->train_samples = h.version >= 2 ? int64_t(h.train_samples) : 0;
  ck->has_settings = hasSettings;
  ck->lr = set.lr;
  ck->momentum_factor = set.momentum;
  ck->weight_decay = set.weight_decay;
  ck->bf16_grads = set.bf16_grads != 0;
  return true;
}

}  // namespace trainer
