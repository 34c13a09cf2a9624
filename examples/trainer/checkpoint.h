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
  // The optimizer's settings and the gradients' wire type (version 3; has_settings false in
  // older files): a resume that changes them does not continue the same trajectory.
  bool has_settings = false;
  double lr = 0, momentum_factor = 0, weight_decay = 0;
  bool bf16_grads = false;
  std::vector<float> params, momentum;
};

// Layer widths a checkpoint holds at most (inputs, hidden layers, outputs).
constexpr size_t kMaxCheckpointLayers = 64;

bool saveCheckpoint(const std::string& path, const Checkpoint& ck, std::string* error);
bool loadCheckpoint(const std::string& path, Checkpoint* ck, std::string* error);
// Whether a checkpoint can be written at path (its temporary file made and removed; one a
// crashed run of the same pid left is overwritten, as a save would).
bool checkpointWritable(const std::string& path, std::string* error);

}  // namespace trainer
