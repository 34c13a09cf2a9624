// Fashion-MNIST (or MNIST) in the IDX format, read from the gzip files Debian's
// dataset-fashion-mnist package installs under /usr/share/datasets/fashion-mnist/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer {

// Images stay as the bytes on disk (47 MB for the training set instead of 188 MB as floats);
// a batch is normalised when it is gathered.
struct Split {
  int count = 0;
  int rows = 0, cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols, row-major, one image after another
  std::vector<uint8_t> labels;  // count, 0..9
  int features() const { return rows * cols; }
};

struct Dataset {
  Split train, test;
};

// Reads one gzip (or plain) IDX file: ubyte images (magic 0x00000803) or labels (0x00000801).
// On failure returns false and says what is wrong with which file in *error.
bool readIdxImages(const std::string& path, Split* split, std::string* error);
bool readIdxLabels(const std::string& path, Split* split, std::string* error);

// Loads {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz from dir, checks that images and labels
// agree, and keeps only the first train_limit / test_limit samples when those are > 0.
bool loadDataset(const std::string& dir, int train_limit, int test_limit, Dataset* out,
                 std::string* error);

// The mean and standard deviation of Fashion-MNIST's training pixels (scaled to [0,1]), used
// to centre the inputs.
constexpr float kPixelMean = 0.2860f;
constexpr float kPixelStd = 0.3530f;

// Writes the normalised pixels of samples idx[0..n) into out (n x features), and their labels.
void gatherBatch(const Split& split, const int* idx, int n, float* out, uint8_t* labels);

}  // namespace trainer
