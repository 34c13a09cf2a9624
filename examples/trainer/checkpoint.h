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
  std::vector<float> params, momentum;
};

bool saveCheckpoint(const std::string& path, const Checkpoint& ck, std::string* error);
bool loadCheckpoint(const std::string& path, Checkpoint* ck, std::string* error);

}  // namespace trainer
