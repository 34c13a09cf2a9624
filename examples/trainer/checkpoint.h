// Training checkpoints: the model's shape, the optimizer step, the parameters and the SGD
// momentum buffers, with a checksum. Rank 0 writes them (atomically: a temporary file renamed
// into place) and, on resume, reads one and broadcasts it, so other ranks need no shared disk.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer {

struct Checkpoint {
  std::vector<int> dims;  // layer widths, inputs first
  int64_t step = 0;       // optimizer steps taken
  int64_t global_batch = 0;
  uint64_t seed = 0;
  bool momentum_started = false;  // PyTorch's SGD starts the buffer from the first gradient
  int64_t train_samples = 0;      // the training set's size (0: not recorded, version 1)
  std::vector<float> params, momentum;
};

bool saveCheckpoint(const std::string& path, const Checkpoint& ck, std::string* error);
bool loadCheckpoint(const std::string& path, Checkpoint* ck, std::string* error);
// Whether a checkpoint can be written at path (its temporary file made and removed).
bool checkpointWritable(const std::string& path, std::string* error);

}  // namespace trainer
