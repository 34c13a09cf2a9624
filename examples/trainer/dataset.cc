#include "examples/trainer/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>

namespace trainer {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension

// gzread reads plain files as well, so an unpacked copy of the data set works too.
class GzFile {
 public:
  explicit GzFile(const std::string& path) : f_(gzopen(path.c_str(), "rb")) {}
  ~GzFile() {
    if (f_) gzclose(f_);
  }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;
  bool ok() const { return f_ != nullptr; }

  // Reads exactly n bytes; false on a short read or a corrupt stream.
  bool read(void* dst, size_t n) {
    auto* p = static_cast<unsigned char*>(dst);
    while (n > 0) {
      unsigned chunk = n > (1u << 30) ? (1u << 30) : static_cast<unsigned>(n);
      int got = gzread(f_, p, chunk);
      if (got <= 0) return false;
      p += got;
      n -= static_cast<size_t>(got);
    }
    return true;
  }
  bool readBigEndian(uint32_t* v) {
    unsigned char b[4];
    if (!read(b, 4)) return false;
    *v = (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
    return true;
  }
  std::string why() {
    int errnum = 0;
    const char* msg = f_ ? gzerror(f_, &errnum) : nullptr;
    return errnum != Z_OK && msg ? std::string(": ") + msg : std::string(" (file too short)");
  }

 private:
  gzFile f_;
};

bool openWithMagic(GzFile& f, const std::string& path, uint32_t magic, std::string* error) {
  if (!f.ok()) {
    *error = "cannot open " + path + ": " + strerror(errno);
    return false;
  }
  uint32_t got = 0;
  if (!f.readBigEndian(&got)) {
    *error = "cannot read the header of " + path + f.why();
    return false;
  }
  if (got != magic) {
    char buf[160];
    snprintf(buf, sizeof buf, ": magic 0x%08x, expected 0x%08x (not an IDX %s file)", got, magic,
             magic == kImagesMagic ? "image" : "label");
    *error = path + buf;
    return false;
  }
  return true;
}

}  // namespace

bool readIdxImages(const std::string& path, Split* split, std::string* error) {
  GzFile f(path);
  if (!openWithMagic(f, path, kImagesMagic, error)) return false;
  uint32_t n = 0, rows = 0, cols = 0;
  if (!f.readBigEndian(&n) || !f.readBigEndian(&rows) || !f.readBigEndian(&cols)) {
    *error = "cannot read the dimensions in " + path + f.why();
    return false;
  }
  if (n == 0 || n > (1u << 24) || rows == 0 || cols == 0 || rows > 4096 || cols > 4096) {
    *error = path + ": implausible dimensions " + std::to_string(n) + " x " + std::to_string(rows) +
             " x " + std::to_string(cols);
    return false;
  }
  split->count = static_cast<int>(n);
  split->rows = static_cast<int>(rows);
  split->cols = static_cast<int>(cols);
  // Read in steps, the buffer growing with what arrives: a corrupt header's count (up to 2^48
  // bytes) fails at the end of the data instead of asking for all of it at once.
  const size_t total = size_t{n} * rows * cols;
  split->pixels.clear();
  for (size_t have = 0; have < total;) {
    const size_t step = std::min<size_t>(total - have, size_t(64) << 20);
    split->pixels.resize(have + step);
    if (!f.read(split->pixels.data() + have, step)) {
      *error = "cannot read " + std::to_string(n) + " images from " + path + f.why();
      return false;
    }
    have += step;
  }
  return true;
}

bool readIdxLabels(const std::string& path, Split* split, std::string* error) {
  GzFile f(path);
  if (!openWithMagic(f, path, kLabelsMagic, error)) return false;
  uint32_t n = 0;
  if (!f.readBigEndian(&n)) {
    *error = "cannot read the label count in " + path + f.why();
    return false;
  }
  if (n == 0 || n > (1u << 24)) {
    *error = path + ": implausible label count " + std::to_string(n);
    return false;
  }
  split->labels.resize(n);
  if (!f.read(split->labels.data(), n)) {
    *error = "cannot read " + std::to_string(n) + " labels from " + path + f.why();
    return false;
  }
  for (uint32_t i = 0; i < n; ++i) {
    if (split->labels[i] > 9) {
      *error = path + ": label " + std::to_string(split->labels[i]) + " of sample " +
               std::to_string(i) + " is not a class 0..9";
      return false;
    }
  }
  return true;
}

namespace {

bool loadSplit(const std::string& dir, const char* prefix, int limit, Split* split,
               std::string* error) {
  std::string images = dir + "/" + prefix + "-images-idx3-ubyte.gz";
  std::string labels = dir + "/" + prefix + "-labels-idx1-ubyte.gz";
  if (!readIdxImages(images, split, error) || !readIdxLabels(labels, split, error)) return false;
  if (split->labels.size() != static_cast<size_t>(split->count)) {
    *error = images + " holds " + std::to_string(split->count) + " images but " + labels +
             " holds " + std::to_string(split->labels.size()) + " labels";
    return false;
  }
  if (limit > 0 && limit < split->count) {
    split->count = limit;
    split->pixels.resize(size_t(limit) * split->features());
    split->labels.resize(size_t(limit));
  }
  return true;
}

}  // namespace

bool loadDataset(const std::string& dir, int train_limit, int test_limit, Dataset* out,
                 std::string* error) {
  if (!loadSplit(dir, "train", train_limit, &out->train, error) ||
      !loadSplit(dir, "t10k", test_limit, &out->test, error)) {
    return false;
  }
  if (out->train.features() != out->test.features()) {
    *error = dir + ": training images are " + std::to_string(out->train.rows) + "x" +
             std::to_string(out->train.cols) + " but test images are " +
             std::to_string(out->test.rows) + "x" + std::to_string(out->test.cols);
    return false;
  }
  return true;
}

void gatherBatch(const Split& split, const int* idx, int n, float* out, uint8_t* labels) {
  const int f = split.features();
  constexpr float kScale = 1.0f / (255.0f * kPixelStd);
  constexpr float kShift = kPixelMean / kPixelStd;
  for (int i = 0; i < n; ++i) {
    const uint8_t* src = split.pixels.data() + size_t(idx[i]) * f;
    float* dst = out + size_t(i) * f;
    for (int j = 0; j < f; ++j) dst[j] = float(src[j]) * kScale - kShift;
    labels[i] = split.labels[size_t(idx[i])];
  }
}

}  // namespace trainer
